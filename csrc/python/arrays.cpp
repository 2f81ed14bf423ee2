#include "arrays.h"

#include "pybubble/limits.h"
#include "pybubble/scheduler.h"

#include <cmath>
#include <limits>

namespace py = pybind11;
using pybubble::format_number;
using pybubble::quote_capped;

namespace {

std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

}  // namespace

namespace arrays_detail {

std::string describe(py::handle value) {
  PyObject* v = value.ptr();
  if (PyBool_Check(v)) return v == Py_True ? "True" : "False";
  if (PyFloat_Check(v)) return format_number(PyFloat_AsDouble(v));
  if (PyLong_Check(v)) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) return format_number(x);
    const unsigned long long u = PyLong_AsUnsignedLongLong(v);
    if (PyErr_Occurred() == nullptr) return format_number(u);
    PyErr_Clear();
    return std::string(overflow < 0 ? "a negative" : "an") + " integer of " +
           py::str(value.attr("bit_length")()).cast<std::string>() + " bits";
  }
  if (PyUnicode_Check(v)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(v, &size);
    if (text == nullptr) {
      PyErr_Clear();
      return "a str";
    }
    return quote_capped(std::string_view(text, static_cast<size_t>(size)));
  }
  return "a " + pybubble::cap_text(Py_TYPE(v)->tp_name) + " object";
}


py::array numeric_array(py::handle value, const std::string& name, int ndim, MaxEntries max) {
  if (value.is_none()) throw py::value_error(name + ": None is not an array of numbers");
  py::array a = py::array::ensure(value);
  if (!a) throw py::value_error(name + ": " + describe(value) + " is not an array of numbers");
  if (a.ndim() != ndim) {
    throw py::value_error(name + ": a " + format_number(a.ndim()) + "-dimensional array, expected " +
                          format_number(ndim) + "-dimensional");
  }
  const int64_t entries = static_cast<int64_t>(ndim == 1 ? a.size() : a.shape(0));
  if (entries > max.limit + max.extra) {
    throw py::value_error(name + ": " + format_number(entries) + (ndim == 1 ? " entries" : " rows") +
                          ", more than the limit of " + format_number(max.limit) +
                          (max.extra ? " + " + format_number(max.extra) : std::string()) + " (LIMITS['" +
                          max.limit_name + "'])");
  }
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u' && kind != 'f') {
    throw py::value_error(name + ": dtype " + dtype_name(a) + " is not a number type (integers or floats)");
  }
  if (kind == 'f' && a.itemsize() > 8) {
    throw py::value_error(name + ": dtype " + dtype_name(a) + " is wider than float64");
  }
  return a;
}

std::string element_name(const std::string& name, const py::array& a, size_t flat) {
  if (a.ndim() == 2 && a.shape(1) > 0) {
    const size_t cols = static_cast<size_t>(a.shape(1));
    return name + "[" + format_number(flat / cols) + ", " + format_number(flat % cols) + "]";
  }
  return name + "[" + format_number(flat) + "]";
}

namespace {

// `a` as a C-contiguous array of T: a cast NumPy makes (exact after the kind checks above).
template <typename T>
py::array_t<T, py::array::c_style | py::array::forcecast> cast(const py::array& a) {
  auto s = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!s) throw py::error_already_set();
  return s;
}

// The integers of `a` (held as T: int64_t or uint64_t) as Out, each checked by `fits(x)`; `refuse`
// names a value that does not fit.
template <typename T, typename Out, typename Fits, typename Refuse>
std::vector<Out> checked_values(const py::array& a, Fits&& fits, Refuse&& refuse) {
  const auto s = cast<T>(a);
  std::vector<Out> out(static_cast<size_t>(s.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const T x = s.data()[i];
    if (!fits(x)) refuse(i, x);
    out[i] = static_cast<Out>(x);
  }
  return out;
}

// Whether integer x has a double of the same value (2^digits is the first double past T's range).
template <typename T>
bool exact_in_double(T x) {
  const double d = static_cast<double>(x);
  return d < std::ldexp(1.0, std::numeric_limits<T>::digits) && static_cast<T>(d) == x;
}

}  // namespace

std::vector<int64_t> int64_values(const py::array& a, const std::string& name) {
  const char kind = a.dtype().kind();
  if (kind == 'f' && a.size() > 0) {
    throw py::value_error(name + ": dtype " + dtype_name(a) + " is not an integer type (values would be cut)");
  }
  if (kind != 'u' || a.itemsize() < 8) {
    const auto s = cast<int64_t>(a);
    return std::vector<int64_t>(s.data(), s.data() + s.size());
  }
  return checked_values<uint64_t, int64_t>(
      a, [](uint64_t x) { return x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()); },
      [&](size_t i, uint64_t x) {
        throw py::value_error(element_name(name, a, i) + ": " + format_number(x) + " is not in [" +
                              format_number(std::numeric_limits<int64_t>::min()) + ", " +
                              format_number(std::numeric_limits<int64_t>::max()) + "]");
      });
}

std::vector<double> float64_values(const py::array& a, const std::string& name) {
  const char kind = a.dtype().kind();
  if (kind == 'f') {
    const auto s = cast<double>(a);
    return std::vector<double>(s.data(), s.data() + s.size());
  }
  // Integers: each must convert to a double exactly.
  const auto lossy = [&](size_t i, auto x) {
    throw py::value_error(element_name(name, a, i) + ": " + format_number(x) + " has no exact float64 value");
  };
  if (kind == 'u' && a.itemsize() == 8) return checked_values<uint64_t, double>(a, exact_in_double<uint64_t>, lossy);
  return checked_values<int64_t, double>(a, exact_in_double<int64_t>, lossy);
}

py::int_ python_int(py::handle value, const std::string& name) {
  if (!PyBool_Check(value.ptr()) && !PyFloat_Check(value.ptr())) {
    PyObject* index = PyNumber_Index(value.ptr());
    if (index != nullptr) return py::reinterpret_steal<py::int_>(index);
    PyErr_Clear();
  }
  throw py::value_error(name + ": " + describe(value) + " is not an integer");
}

void out_of_range(py::handle value, const std::string& name, const std::string& lo, const std::string& hi) {
  throw py::value_error(name + ": " + describe(value) + " is not in [" + lo + ", " + hi + "]");
}

}  // namespace arrays_detail

using arrays_detail::describe;

double read_float(py::handle value, const std::string& name) {
  if (value.is_none() || PyBool_Check(value.ptr()) || PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr())) {
    throw py::value_error(name + ": " + describe(value) + " is not a number");
  }
  if (PyFloat_Check(value.ptr())) return PyFloat_AsDouble(value.ptr());
  py::array a = py::array::ensure(value);
  if (!a || a.ndim() != 0) throw py::value_error(name + ": " + describe(value) + " is not a number");
  const char kind = a.dtype().kind();
  if ((kind != 'i' && kind != 'u' && kind != 'f') || (kind == 'f' && a.itemsize() > 8)) {
    throw py::value_error(name + ": " + describe(value) + " (dtype " + dtype_name(a) + ") is not a number");
  }
  return arrays_detail::float64_values(a.reshape({1}), name).front();
}

std::vector<double> read_rows(py::handle value, const std::string& name, int64_t cols, MaxEntries max,
                              int64_t& rows) {
  const py::array a = arrays_detail::numeric_array(value, name, 2, max);
  if (a.shape(1) != cols) {
    throw py::value_error(name + ": expected an N x " + format_number(cols) + " array, got " +
                          format_number(static_cast<int64_t>(a.shape(1))) + " columns");
  }
  rows = static_cast<int64_t>(a.shape(0));
  return arrays_detail::float64_values(a, name);
}

std::string read_text(py::handle value, const std::string& name) {
  if (!PyUnicode_Check(value.ptr())) throw py::value_error(name + ": " + describe(value) + " is not a str");
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (text == nullptr) {
    PyErr_Clear();
    throw py::value_error(name + ": a str that is not valid UTF-8");
  }
  return std::string(text, static_cast<size_t>(size));
}

py::object read_attr(py::handle value, const char* attr, const std::string& name) {
  if (!py::hasattr(value, attr)) {
    throw py::value_error(name + ": missing (" + describe(value) + " has no attribute '" + attr + "')");
  }
  return value.attr(attr);
}

pybubble::Schedule read_schedule(py::handle start, py::handle assignment, py::handle step_time, py::handle shift_front,
                                 py::handle shift_back) {
  pybubble::Schedule s;
  s.start = read_array<double>(start, "start", {pybubble::kMaxTasks, "tasks"});
  s.assignment = read_array<int64_t>(assignment, "assignment", {pybubble::kMaxMicrobatches, "microbatches"});
  s.step_time = read_float(step_time, "step_time");
  s.shift_front = read_float(shift_front, "shift_front");
  s.shift_back = read_float(shift_back, "shift_back");
  return s;
}
