// Materialized attention problems of the memeff program (see cli_problem.h): random inputs and
// their device copies, the workspace hand-over and the rates the timing commands report.
#include "cli_problem.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "memeff/error.h"

namespace memeff::cli {

Device resolve_device(DeviceChoice choice, std::string* note) {
  if (choice == DeviceChoice::cpu) return Device::cpu();
  const CudaStatus cuda = cuda_status();
  if (choice == DeviceChoice::cuda) {
    if (!cuda.why_not.empty()) throw Error(ErrorCode::cuda_error, "--device cuda: " + cuda.why_not);
    return Device::cuda(0);
  }
  if (cuda.why_not.empty()) return Device::cuda(0);
  if (note) *note = cuda.why_not + "; running on the CPU";
  return Device::cpu();
}

std::vector<std::int64_t> bias_dims(const ShapeConfig& c) {
  return {c.bias.bcast_b ? 1 : c.B, c.bias.bcast_h ? 1 : c.Hq, c.bias.bcast_q ? 1 : c.Lq, c.lk()};
}

std::vector<float> alibi_slopes(std::int64_t heads) {
  std::int64_t n = 1;  // the largest power of two <= heads
  while (n * 2 <= heads) n *= 2;
  std::vector<float> slopes;
  for (std::int64_t h = 0; h < n && h < heads; ++h) {
    slopes.push_back(static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / n)));
  }
  for (std::int64_t k = 0; static_cast<std::int64_t>(slopes.size()) < heads; ++k) {
    slopes.push_back(static_cast<float>(std::exp2(-4.0 * static_cast<double>(2 * k + 1) / n)));
  }
  return slopes;
}

AttentionArgs make_args(const ShapeConfig& c, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& bias, const TensorView& slopes) {
  AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  if (c.bias.present) a.bias = bias;
  a.scale = c.scale;
  a.causal = c.causal;
  a.dropout_p = c.dropout;
  a.rng.seed = c.seed;
  a.rng.offset = c.offset;
  a.window = c.window;
  a.softcap = c.softcap;
  if (c.alibi) {
    if (!slopes.defined()) throw Error(ErrorCode::internal, "--alibi: no slopes were made");
    a.alibi_slopes = slopes;
  }
  return a;
}

AttentionArgs AttentionData::args() const {
  return make_args(config, q.view(), k.view(), v.view(),
                   config.bias.present ? bias.view() : TensorView{},
                   config.alibi ? slopes.view() : TensorView{});
}

BackwardTensors AttentionData::grads() const {
  return {dout.view(),
          out.view(),
          lse.view(),
          dq.view(),
          dk.view(),
          dv.view(),
          config.bias.present ? std::optional(dbias.view()) : std::nullopt};
}

double AttentionData::forward_flops() const {
  return attention_flops(config.B, config.Hq, config.Lq, config.lk(), config.D, config.causal,
                         config.window);
}

AttentionData make_attention_data(const ShapeConfig& c, Device device) {
  c.check();
  AttentionData d;
  d.config = c;
  d.device = device;
  d.dtype = c.dtype_on(device.type);
  const std::int64_t B = c.B, Hq = c.Hq, Hkv = c.hkv(), Lq = c.Lq, Lk = c.lk(), D = c.D,
                     Dv = c.dv();
  const Shape q_shape{{B, Hq, Lq, D}}, k_shape{{B, Hkv, Lk, D}}, v_shape{{B, Hkv, Lk, Dv}},
      o_shape{{B, Hq, Lq, Dv}}, lse_shape{{B, Hq, Lq}}, bias_shape{bias_dims(c)};

  d.q_host = HostArray(d.dtype, q_shape);
  d.k_host = HostArray(d.dtype, k_shape);
  d.v_host = HostArray(d.dtype, v_shape);
  d.dout_host = HostArray(d.dtype, o_shape);
  fill_normal(d.q_host, c.seed, 1);
  fill_normal(d.k_host, c.seed, 2);
  fill_normal(d.v_host, c.seed, 3);
  fill_normal(d.dout_host, c.seed, 4);
  const DType bias_dtype = c.bias_dtype_for(d.dtype);
  if (c.bias.present && bias_dtype != d.dtype && bias_dtype != DType::f32) {
    throw UsageError(std::string("--bias-dtype: expected ") + dtype_name(d.dtype) +
                     " (the inputs') or fp32, got " + dtype_name(bias_dtype));
  }
  if (c.bias.present) {
    d.bias_host = HostArray(bias_dtype, bias_shape);
    fill_normal(d.bias_host, c.seed, 5);
  }

  d.q = DeviceTensor(device, d.dtype, q_shape);
  d.k = DeviceTensor(device, d.dtype, k_shape);
  d.v = DeviceTensor(device, d.dtype, v_shape);
  d.dout = DeviceTensor(device, d.dtype, o_shape);
  d.q.upload(d.q_host);
  d.k.upload(d.k_host);
  d.v.upload(d.v_host);
  d.dout.upload(d.dout_host);
  if (c.bias.present) {
    d.bias = DeviceTensor(device, bias_dtype, bias_shape);
    d.bias.upload(d.bias_host);
    d.dbias = DeviceTensor(device, bias_dtype, bias_shape);
  }
  if (c.alibi) {
    const std::vector<float> slopes = alibi_slopes(c.Hq);
    d.slopes_host = HostArray(DType::f32, Shape{{c.Hq}});
    for (std::int64_t h = 0; h < c.Hq; ++h) d.slopes_host.set(h, slopes[h]);
    d.slopes = DeviceTensor(device, DType::f32, Shape{{c.Hq}});
    d.slopes.upload(d.slopes_host);
  }
  d.out = DeviceTensor(device, d.dtype, o_shape);
  d.lse = DeviceTensor(device, DType::f32, lse_shape);
  d.dq = DeviceTensor(device, d.dtype, q_shape);
  d.dk = DeviceTensor(device, d.dtype, k_shape);
  d.dv = DeviceTensor(device, d.dtype, v_shape);
  // All-ones bytes are NaN in fp32, fp16 and bf16: an element a backend forgets to write fails.
  for (DeviceTensor* t : {&d.out, &d.lse, &d.dq, &d.dk, &d.dv, &d.dbias})
    t->buffer.fill_bytes(0xFF);
  return d;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Options with_workspace(Options options, const Buffer& workspace) {
  options.workspace = workspace.data();
  options.workspace_bytes = workspace.bytes();
  return options;
}

PassRates::PassRates(double forward_flops, double fwd, double bwd) : fwd_ms(fwd), bwd_ms(bwd) {
  auto tflops = [](double flops, double ms) { return ms > 0 ? flops / ms / 1e9 : 0.0; };
  fwd_tflops = tflops(forward_flops * pass_flop_factor(Pass::forward), fwd_ms);
  bwd_tflops = tflops(forward_flops * pass_flop_factor(Pass::backward), bwd_ms);
  fwdbwd_tflops = tflops(forward_flops * training_flop_factor(), fwd_ms + bwd_ms);
}

std::string flops_help() {
  char factor[32];
  std::snprintf(factor, sizeof factor, "%g", pass_flop_factor(Pass::backward));
  return std::string("forward 4*B*Hq*Lq*Lk*D (halved when causal), backward ") + factor + "x";
}

}  // namespace memeff::cli
