// Python -> C++ and back for the bindings. What comes from Python is read strictly: integer
// fields take integer dtypes whose values fit, float fields take float or integer dtypes whose
// values convert exactly; bools, objects, strings, complex numbers, wrong shapes and values out of
// range are a ValueError naming the field and the value, never a silent wrap.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pybubble/message.h"

/// The most entries (rows, for a two-dimensional array) an argument may hold: `limit` + `extra`,
/// where `limit` is _core.LIMITS[`limit_name`].
struct MaxEntries {
  int64_t limit;           ///< a limit of limits.h
  const char* limit_name;  ///< its key in _core.LIMITS
  int64_t extra = 0;       ///< e.g. 1 for offsets (one per row, plus one)
};

namespace arrays_detail {

/// `value` as a NumPy array of numbers with `ndim` dimensions and at most `max` entries (rows),
/// checked before anything is copied (ValueError otherwise).
pybind11::array numeric_array(pybind11::handle value, const std::string& name, int ndim, MaxEntries max);
/// The values of a numeric array as int64 (integer dtypes, or an empty array of any number dtype).
std::vector<int64_t> int64_values(const pybind11::array& a, const std::string& name);
/// The values of a numeric array as float64 (float dtypes up to 64 bits, exact integers).
std::vector<double> float64_values(const pybind11::array& a, const std::string& name);
/// The name of element `flat` of an array of `shape`, e.g. "costs[3, 1]".
std::string element_name(const std::string& name, const pybind11::array& a, size_t flat);
/// A Python integer (int or NumPy integer, not bool) as a Python int; ValueError otherwise.
pybind11::int_ python_int(pybind11::handle value, const std::string& name);
/// A short description of a caller's value for a message: numbers and short strings as they are,
/// anything else by its type (never an unbounded repr).
std::string describe(pybind11::handle value);
/// ValueError: `name`: the value is not in [lo, hi].
[[noreturn]] void out_of_range(pybind11::handle value, const std::string& name, const std::string& lo,
                               const std::string& hi);

}  // namespace arrays_detail

/// Reads `value` (any array-like: a NumPy array of any order, a list) as a one-dimensional array
/// of T (int64_t, int32_t, uint8_t or double) of at most `max` entries. ValueError naming `name`
/// for another shape, too many entries, a refused dtype, or an element that does not fit T.
template <typename T>
std::vector<T> read_array(pybind11::handle value, const std::string& name, MaxEntries max) {
  const pybind11::array a = arrays_detail::numeric_array(value, name, 1, max);
  if constexpr (std::is_same_v<T, double>) {
    return arrays_detail::float64_values(a, name);
  } else {
    std::vector<int64_t> v = arrays_detail::int64_values(a, name);
    if constexpr (std::is_same_v<T, int64_t>) {
      return v;
    } else {
      std::vector<T> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] < std::numeric_limits<T>::min() || v[i] > std::numeric_limits<T>::max()) {
          throw pybind11::value_error(arrays_detail::element_name(name, a, i) + ": " +
                                      pybubble::format_number(v[i]) + " is not in [" +
                                      pybubble::format_number(std::numeric_limits<T>::min()) + ", " +
                                      pybubble::format_number(std::numeric_limits<T>::max()) + "]");
        }
        out[i] = static_cast<T>(v[i]);
      }
      return out;
    }
  }
}

/// Reads `value` as a two-dimensional array of float64 with `cols` columns and at most `max` rows,
/// row-major; `rows` receives its row count. ValueError naming `name` otherwise.
std::vector<double> read_rows(pybind11::handle value, const std::string& name, int64_t cols, MaxEntries max,
                              int64_t& rows);

/// Reads `value` as an integer of type T: a Python int or a NumPy integer (not a bool, not a
/// float) inside T's range; otherwise a ValueError naming `name` and the value.
template <typename T>
T read_int(pybind11::handle value, const std::string& name) {
  const pybind11::int_ v = arrays_detail::python_int(value, name);
  if constexpr (std::is_signed_v<T>) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow == 0 && x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max()) {
      return static_cast<T>(x);
    }
  } else {
    const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
    if (PyErr_Occurred() == nullptr && x <= std::numeric_limits<T>::max()) return static_cast<T>(x);
    PyErr_Clear();
  }
  arrays_detail::out_of_range(v, name, pybubble::format_number(std::numeric_limits<T>::min()),
                              pybubble::format_number(std::numeric_limits<T>::max()));
}

/// Reads `value` as a float: a Python or NumPy float or integer that converts exactly (not a bool,
/// a string, a complex number); otherwise a ValueError naming `name`.
double read_float(pybind11::handle value, const std::string& name);

namespace pybubble {
struct Schedule;
}  // namespace pybubble
/// A pybubble.schedule/1 from its fields, each read as above (the starts and the assignment at most
/// kMaxTasks and kMaxMicrobatches entries).
pybubble::Schedule read_schedule(pybind11::handle start, pybind11::handle assignment, pybind11::handle step_time,
                                 pybind11::handle shift_front, pybind11::handle shift_back);

/// `value` as the C++ object of a class bound by pybind11 (e.g. a _core.Problem); ValueError naming
/// `name` for anything else.
template <typename T>
T& read_bound(pybind11::handle value, const std::string& name, const char* type_name) {
  if (!pybind11::isinstance<T>(value)) {
    throw pybind11::value_error(name + ": " + arrays_detail::describe(value) + " is not a " + type_name);
  }
  return value.cast<T&>();
}

/// Reads `value` as a str; ValueError naming `name` otherwise.
std::string read_text(pybind11::handle value, const std::string& name);

/// The attribute `attr` of `value`; ValueError naming `name` when it has none.
pybind11::object read_attr(pybind11::handle value, const char* attr, const std::string& name);

/// A copy of `v` as a NumPy array.
template <typename T>
pybind11::array_t<T> to_array(const std::vector<T>& v) {
  pybind11::array_t<T> out(static_cast<pybind11::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

/// Moves `v` into a NumPy array without copying: the array owns the vector's buffer.
template <typename T>
pybind11::array_t<T> to_array(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  pybind11::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return pybind11::array_t<T>(static_cast<pybind11::ssize_t>(owned->size()), owned->data(), free_when_done);
}
