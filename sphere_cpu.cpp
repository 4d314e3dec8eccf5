// The fused sphere update on the CPU (sphere_impl='fused'): sphere_kernels.py's
// sphere_forward / sphere_backward written as one pass per row.
//
// A row of h and F(h) (and of the output gradient) is read from memory once and stays in
// L1 while its three small loops run: the reductions, then the per-row scalars (r, s,
// beta, theta, cos, sin, phi' computed once per row, in double), then the write. Rows are
// spread over torch's intra-op threads. The reductions use eight independent float
// partial sums (double for double inputs), which the compiler turns into SIMD code, as
// torch's own sum does. Built at first use by torch.utils.cpp_extension (sphere_kernels.py).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr double kEps = 1e-12;  // the clamp on r^2 and s^2, as in the reference update
constexpr int kLanes = 8;

enum Kind { kGeo = 0, kProj = 1, kCay = 2, kP = 3 };

struct Angle {
  double cos, sin, dphi;
};

// cos(theta), sin(theta) and phi'(beta) for theta = phi(beta): retraction_angle in Python.
Angle retraction_angle(int kind, double beta, double p, double angle_max) {
  switch (kind) {
    case kGeo: {
      const double theta = std::min(beta, angle_max);
      return {std::cos(theta), std::sin(theta), beta <= angle_max ? 1.0 : 0.0};
    }
    case kProj: {
      const double q = 1.0 / std::sqrt(1.0 + beta * beta);
      return {q, beta * q, q * q};
    }
    case kCay: {
      const double beta_max = 2.0 * std::tan(angle_max / 2.0);
      const double b = std::min(beta, beta_max);
      const double den = 4.0 + b * b;
      return {(4.0 - b * b) / den, 4.0 * b / den, beta <= beta_max ? 4.0 / (4.0 + beta * beta) : 0.0};
    }
    default: {
      const double u = beta / p;
      double theta = p * std::atan(u);
      double dphi = 1.0 / (1.0 + u * u);
      if (p > 1.0 && theta > angle_max) {
        theta = angle_max;
        dphi = 0.0;
      }
      return {std::cos(theta), std::sin(theta), dphi};
    }
  }
}

// The accumulator type: float for float/bf16/half inputs, double for double.
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

// Sums of x*y over a row with kLanes independent partial sums (vectorisable, like torch.sum).
template <typename T, typename A>
inline void dot2(const T* x, const T* y, int64_t d, A& xx, A& xy) {
  A sxx[kLanes] = {}, sxy[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const A a = static_cast<A>(x[j + l]), b = static_cast<A>(y[j + l]);
      sxx[l] += a * a;
      sxy[l] += a * b;
    }
  }
  for (; j < d; ++j) {
    const A a = static_cast<A>(x[j]), b = static_cast<A>(y[j]);
    sxx[0] += a * a;
    sxy[0] += a * b;
  }
  xx = 0;
  xy = 0;
  for (int l = 0; l < kLanes; ++l) {
    xx += sxx[l];
    xy += sxy[l];
  }
}

// Per-row geometry shared by forward and backward.
template <typename T, typename A>
struct Row {
  A hh, r2, c, ss;
  double r, s, beta;
  Angle ang;

  Row(const T* h, const T* f, int64_t d, double alpha, int kind, double p, double angle_max) {
    A hf;
    dot2(h, f, d, hh, hf);
    r2 = std::max(hh, static_cast<A>(kEps));
    c = hf / r2;
    A sz[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= d; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const A z = static_cast<A>(f[j + l]) - c * static_cast<A>(h[j + l]);
        sz[l] += z * z;
      }
    }
    for (; j < d; ++j) {
      const A z = static_cast<A>(f[j]) - c * static_cast<A>(h[j]);
      sz[0] += z * z;
    }
    ss = 0;
    for (int l = 0; l < kLanes; ++l) ss += sz[l];
    r = std::sqrt(static_cast<double>(r2));
    s = std::sqrt(std::max(static_cast<double>(ss), kEps));
    beta = alpha * s / r;
    ang = retraction_angle(kind, beta, p, angle_max);
  }
};

constexpr int64_t kGrain = 16;  // rows per task: a few microseconds of work

template <typename T>
void forward_rows(const T* h, const T* f, T* out, int64_t n, int64_t d, double alpha, int kind, double p,
                  double angle_max) {
  using A = typename Acc<T>::type;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* hr = h + i * d;
      const T* fr = f + i * d;
      const Row<T, A> row(hr, fr, d, alpha, kind, p, angle_max);
      const A a = static_cast<A>(row.ang.cos);
      const A b = static_cast<A>(row.r * row.ang.sin / row.s);
      T* o = out + i * d;
      for (int64_t j = 0; j < d; ++j) {
        const A hv = static_cast<A>(hr[j]);
        const A z = static_cast<A>(fr[j]) - row.c * hv;
        o[j] = static_cast<T>(a * hv + b * z);
      }
    }
  });
}

// The derivation is in sphere_kernels.sphere_backward's docstring.
template <typename T>
void backward_rows(const T* g, const T* h, const T* f, T* dh, T* df, double* dalpha_rows, int64_t n, int64_t d,
                   double alpha, int kind, double p, double angle_max) {
  using A = typename Acc<T>::type;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* gr = g + i * d;
      const T* hr = h + i * d;
      const T* fr = f + i * d;
      const Row<T, A> row(hr, fr, d, alpha, kind, p, angle_max);
      A sgh[kLanes] = {}, sgz[kLanes] = {}, szh[kLanes] = {};
      int64_t j = 0;
      for (; j + kLanes <= d; j += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          const A gv = static_cast<A>(gr[j + l]), hv = static_cast<A>(hr[j + l]);
          const A z = static_cast<A>(fr[j + l]) - row.c * hv;
          sgh[l] += gv * hv;
          sgz[l] += gv * z;
          szh[l] += z * hv;
        }
      }
      for (; j < d; ++j) {
        const A gv = static_cast<A>(gr[j]), hv = static_cast<A>(hr[j]);
        const A z = static_cast<A>(fr[j]) - row.c * hv;
        sgh[0] += gv * hv;
        sgz[0] += gv * z;
        szh[0] += z * hv;
      }
      double gh = 0, gz = 0, zh = 0;
      for (int l = 0; l < kLanes; ++l) {
        gh += sgh[l];
        gz += sgz[l];
        zh += szh[l];
      }
      const double r = row.r, s = row.s, r2 = row.r2, c = row.c;
      const double cs = row.ang.cos, sn = row.ang.sin;
      const double B = r * sn / s;
      const double dbeta = row.ang.dphi * (-sn * gh + (r * cs / s) * gz);
      const double dr = gz * sn / s - dbeta * row.beta / r;
      const double ds = -gz * B / s + dbeta * alpha / r;
      const double k = row.ss >= kEps ? ds / s : 0.0;
      const double dc = -(B * gh + k * zh);
      const double dhf = dc / r2;
      const double dhh = row.hh >= kEps ? dr / (2.0 * r) - dc * c / r2 : 0.0;
      dalpha_rows[i] = dbeta * s / r;
      // dF = B g + k z + dhf h;  dh = (A - c B) g - c k z + dhf F + 2 dhh h, with z = F - c h.
      const A cg_f = static_cast<A>(B), ck_f = static_cast<A>(k), ch_f = static_cast<A>(dhf - k * c);
      const A ag_h = static_cast<A>(cs - c * B), af_h = static_cast<A>(dhf - c * k);
      const A ah_h = static_cast<A>(c * c * k + 2.0 * dhh);
      T* dhr = dh + i * d;
      T* dfr = df + i * d;
      for (int64_t jj = 0; jj < d; ++jj) {
        const A gv = static_cast<A>(gr[jj]), hv = static_cast<A>(hr[jj]), fv = static_cast<A>(fr[jj]);
        dfr[jj] = static_cast<T>(cg_f * gv + ck_f * fv + ch_f * hv);
        dhr[jj] = static_cast<T>(ag_h * gv + af_h * fv + ah_h * hv);
      }
    }
  });
}

void check_inputs(const torch::Tensor& h, const torch::Tensor& f) {
  TORCH_CHECK(h.device().is_cpu() && f.device().is_cpu(), "sphere_cpu: inputs must be CPU tensors");
  TORCH_CHECK(h.dim() == 2 && h.sizes() == f.sizes(), "sphere_cpu: h and F(h) must be (rows, d) of one shape");
  TORCH_CHECK(h.is_contiguous() && f.is_contiguous(), "sphere_cpu: inputs must be contiguous");
  TORCH_CHECK(h.scalar_type() == f.scalar_type(), "sphere_cpu: h and F(h) must share a dtype");
}

torch::Tensor forward(torch::Tensor h, torch::Tensor f, double alpha, int64_t kind, double p, double angle_max) {
  check_inputs(h, f);
  auto out = torch::empty_like(h);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, h.scalar_type(), "sphere_forward", [&] {
    forward_rows<scalar_t>(h.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), h.size(0),
                           h.size(1), alpha, static_cast<int>(kind), p, angle_max);
  });
  return out;
}

std::vector<torch::Tensor> backward(torch::Tensor g, torch::Tensor h, torch::Tensor f, double alpha, int64_t kind,
                                    double p, double angle_max) {
  check_inputs(h, f);
  check_inputs(g, h);
  auto dh = torch::empty_like(h);
  auto df = torch::empty_like(f);
  auto dalpha_rows = torch::empty({h.size(0)}, h.options().dtype(torch::kFloat64));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, h.scalar_type(), "sphere_backward", [&] {
    backward_rows<scalar_t>(g.data_ptr<scalar_t>(), h.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                            dh.data_ptr<scalar_t>(), df.data_ptr<scalar_t>(), dalpha_rows.data_ptr<double>(),
                            h.size(0), h.size(1), alpha, static_cast<int>(kind), p, angle_max);
  });
  return {dh, df, dalpha_rows.sum()};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused sphere update, forward");
  m.def("backward", &backward, "fused sphere update, backward: grads of h, F(h), alpha");
}
