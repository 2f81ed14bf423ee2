// NumPy <-> std::vector conversions shared by the bindings.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

template <typename T>
using carray = pybind11::array_t<T, pybind11::array::c_style | pybind11::array::forcecast>;

template <typename T>
std::vector<T> to_vector(const carray<T>& a) {
  if (a.ndim() != 1) throw pybind11::value_error("expected a one-dimensional array");
  return std::vector<T>(a.data(), a.data() + a.size());
}

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
