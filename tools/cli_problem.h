// One attention problem of the memeff program, materialized: random inputs (host copies kept
// for the reference check), device buffers for every input and output, and the AttentionArgs /
// BackwardTensors that point at them. Shared by run, bench and tune.
#pragma once

#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_tensor.h"
#include "memeff/attention.h"

namespace memeff::cli {

// The device a command runs on. `automatic` picks cuda:0 when the build has CUDA and a device
// is present, else the CPU, and sets `note` to say why (e.g. "no CUDA device is present").
// `cuda` throws memeff::Error when CUDA is not usable.
Device resolve_device(DeviceChoice choice, std::string* note);

// Shapes of the tensors of a problem.
std::vector<std::int64_t> bias_dims(const ShapeConfig& c);

// ALiBi's standard slopes for `heads` heads: 2^(-8(h+1)/heads) when heads is a power of two;
// otherwise those of the largest power of two n below it, then 2^(-4(2k+1)/n) for k = 0, 1, ..
// (every other slope of 2n heads) until there are `heads`.
std::vector<float> alibi_slopes(std::int64_t heads);

// The attention arguments of a shape config over the given views (bias only when it has one;
// `slopes`, fp32 [Hq], only with --alibi, when it must be given).
AttentionArgs make_args(const ShapeConfig& c, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& bias, const TensorView& slopes = {});

struct AttentionData {
  ShapeConfig config;
  Device device{};
  DType dtype = DType::f32;
  // Host inputs in the storage dtype (what the device holds, bit for bit).
  HostArray q_host, k_host, v_host, bias_host, dout_host;
  HostArray slopes_host;  // fp32 [Hq], with --alibi
  DeviceTensor q, k, v, bias, dout, slopes;
  DeviceTensor out, lse, dq, dk, dv, dbias;

  AttentionArgs args() const;
  BackwardTensors grads() const;
  double forward_flops() const;  // memeff::attention_flops of the shape (and window)
};

// Allocates and fills a problem: q, k, v, dout ~ N(0, 1) and bias ~ N(0, 1) from `config.seed`;
// outputs poisoned with NaN so an unwritten element fails the check.
AttentionData make_attention_data(const ShapeConfig& config, Device device);

// `options` handing `workspace` to a call (Options::workspace and workspace_bytes), so that the
// timed calls allocate nothing.
Options with_workspace(Options options, const Buffer& workspace);

// Median times of both passes and their rates. FLOPs: the forward's (attention_flops) times
// pass_flop_factor, training_flop_factor for the two together; 0 TFLOP/s for a zero time.
struct PassRates {
  double fwd_ms = 0.0, bwd_ms = 0.0;
  double fwd_tflops = 0.0, bwd_tflops = 0.0, fwdbwd_tflops = 0.0;
  PassRates() = default;
  PassRates(double forward_flops, double fwd_ms, double bwd_ms);
};
// The count above for --help: "forward 4*B*Hq*Lq*Lk*D (halved when causal), backward 2.5x".
std::string flops_help();

double median(std::vector<double> values);

}  // namespace memeff::cli
