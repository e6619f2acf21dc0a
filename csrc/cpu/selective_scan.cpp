// The fused selective scan's CPU kernels: each (batch, channel) walks its sequence in scan
// order, all N states a step (the decay 0 at the cuts of packed sequences; with a state a
// segment, the state entering a cut is the segment's own initial state). Arithmetic is
// float64 for float64 storage, float32 otherwise.
// The math is selective_params.h's; the forward saves the state entering steps 0, 128, ...
// (the checkpoints), from which the backward rebuilds a span's states, last span first, and
// walks it back with the state gradient.
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "../kernels/launch.h"
#include "storages.h"

namespace linrec {
namespace {

template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };

template <typename Acc> Acc sigmoid(Acc x) { return Acc(1) / (Acc(1) + std::exp(-x)); }
// torch's softplus (beta 1, threshold 20).
template <typename Acc> Acc softplus(Acc x) { return x > Acc(20) ? x : std::log1p(std::exp(x)); }

// The call's tensors as one channel (b, d) reads them: V the values' type, BC per-step B and
// C's, Acc the arithmetic's (and of A, D, delta_bias, the states, per-channel B and C).
template <typename V, typename BC, typename Acc>
struct Channel {
  const SelectiveParams& p;
  int64_t b, d, group;

  Channel(const SelectiveParams& params, int64_t bd)
      : p(params), b(bd / params.dim), d(bd % params.dim), group(d / (params.dim / params.groups)) {}

  int64_t pos(int64_t t) const { return p.reverse ? p.seq_len - 1 - t : t; }
  int64_t seq(const Strides3& s, int64_t t) const { return b * s.batch + d * s.channel + pos(t) * s.step; }
  Acc value(const void* data, const Strides3& s, int64_t t) const {
    return static_cast<Acc>(static_cast<const V*>(data)[seq(s, t)]);
  }
  Acc u(int64_t t) const { return value(p.u, p.u_strides, t); }
  Acc z(int64_t t) const { return value(p.z, p.z_strides, t); }
  // delta + delta_bias before the softplus.
  Acc raw_dt(int64_t t) const {
    const Acc bias = p.delta_bias ? static_cast<const Acc*>(p.delta_bias)[d] : Acc(0);
    return value(p.delta, p.delta_strides, t) + bias;
  }
  Acc dt(Acc raw) const { return p.delta_softplus ? softplus(raw) : raw; }
  // B or C at state n and step t.
  Acc bc(const void* data, const StridesBC& s, bool per_step, int64_t n, int64_t t) const {
    if (!per_step) return static_cast<const Acc*>(data)[d * s.group + n * s.state];
    return static_cast<Acc>(
        static_cast<const BC*>(data)[b * s.batch + group * s.group + n * s.state + pos(t) * s.step]);
  }
  Acc B(int64_t n, int64_t t) const { return bc(p.B, p.b_strides, p.b_per_step, n, t); }
  Acc C(int64_t n, int64_t t) const { return bc(p.C, p.c_strides, p.c_per_step, n, t); }
  Acc A(int64_t n) const { return static_cast<const Acc*>(p.A)[d * p.states + n]; }
  // Whether step t begins a segment of a packed sequence: its decay reads as 0 there, unless
  // the segment has an initial state of its own.
  bool cut(int64_t t) const { return p.cuts && p.cuts[pos(t)]; }
  bool restarts(bool cut_here) const { return cut_here && !(p.segment_of && p.initial); }
  // The decay exp(dt * A) of state n at a step (0 where the state restarts from 0).
  Acc decay(Acc dt, int64_t n, bool cut_here) const { return restarts(cut_here) ? Acc(0) : std::exp(dt * A(n)); }
  // A state a segment: step t's segment, whether t is its last step in scan order, and where
  // a segment's state n is in initial / last_state.
  int64_t segment(int64_t t) const { return p.segment_of[pos(t)]; }
  bool ends_segment(int64_t t) const { return t + 1 == p.seq_len || cut(t + 1); }
  int64_t segment_state_at(int64_t k, int64_t n) const { return ((b * p.dim + d) * p.segments + k) * p.states + n; }
  // The state entering step t, where before[] is the state the previous step left: a segment's
  // own initial state (or 0) at its cut.
  Acc entering(const Acc* before, int64_t n, int64_t t, bool cut_here) const {
    if (!(p.segment_of && cut_here)) return before[n];
    return p.initial ? static_cast<const Acc*>(p.initial)[segment_state_at(segment(t), n)] : Acc(0);
  }
  Acc D() const { return p.D ? static_cast<const Acc*>(p.D)[d] : Acc(0); }
  int64_t state_at(int64_t n) const { return (b * p.dim + d) * p.states + n; }
  int64_t checkpoint_at(int64_t k, int64_t n) const {
    return ((b * p.dim + d) * num_checkpoints(p.seq_len) + k) * p.states + n;
  }
};

template <typename V, typename BC>
void fwd(const SelectiveParams& p) {
  using Acc = typename AccType<V>::type;
  const int64_t N = p.states, L = p.seq_len;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, L * std::max<int64_t>(N, 1)));
  torch::stable::parallel_for(0, p.batch * p.dim, grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> h(N);
    for (int64_t bd = begin; bd < end; ++bd) {
      const Channel<V, BC, Acc> ch(p, bd);
      const bool per_segment = p.segment_of != nullptr;
      for (int64_t n = 0; n < N; ++n)
        h[n] = p.initial && !per_segment ? static_cast<const Acc*>(p.initial)[ch.state_at(n)] : Acc(0);
      for (int64_t t = 0; t < L; ++t) {
        if (t % kCheckpointSteps == 0)  // the state the previous step left
          std::copy(h.begin(), h.end(), static_cast<Acc*>(p.checkpoints) + ch.checkpoint_at(t / kCheckpointSteps, 0));
        const Acc dt = ch.dt(ch.raw_dt(t)), u = ch.u(t);
        const bool cut = ch.cut(t);
        Acc y = 0;
        for (int64_t n = 0; n < N; ++n) {
          h[n] = ch.decay(dt, n, cut) * ch.entering(h.data(), n, t, cut) + dt * u * ch.B(n, t);
          y += ch.C(n, t) * h[n];
        }
        y += ch.D() * u;
        if (p.z) y *= ch.z(t) * sigmoid(ch.z(t));
        static_cast<V*>(p.y)[bd * L + ch.pos(t)] = static_cast<V>(y);
        if (per_segment && ch.ends_segment(t))
          std::copy(h.begin(), h.end(), static_cast<Acc*>(p.last_state) + ch.segment_state_at(ch.segment(t), 0));
      }
      if (!per_segment)
        for (int64_t n = 0; n < N; ++n) static_cast<Acc*>(p.last_state)[ch.state_at(n)] = h[n];
    }
  });
}

// The backward's sums over channels: d_A, d_D, d_delta_bias and per-channel d_B, d_C sum
// over the batch, per-step d_B, d_C over a group's channels. A task takes whole (batch,
// group) pairs, so it alone writes its rows of per-step d_B and d_C; its per-channel sums
// go to a buffer of its own, added into the outputs under a lock at its end.
template <typename Acc>
struct ChannelSums {
  std::vector<Acc> dA, dB, dC, dD, dbias;  // (dim, N), (dim, N) where per channel, (dim,)

  ChannelSums(const SelectiveGradParams& p)
      : dA(p.dim * p.states), dB(p.b_per_step ? 0 : p.dim * p.states), dC(p.c_per_step ? 0 : p.dim * p.states),
        dD(p.dim), dbias(p.dim) {}

  void add_into(const SelectiveGradParams& p) const {
    const auto add = [](void* out, const std::vector<Acc>& sums) {
      for (size_t i = 0; out && i < sums.size(); ++i) static_cast<Acc*>(out)[i] += sums[i];
    };
    add(p.d_A, dA);
    add(p.d_B, dB);
    add(p.d_C, dC);
    add(p.d_D, dD);
    add(p.d_delta_bias, dbias);
  }
};

template <typename V, typename BC>
void bwd(const SelectiveGradParams& p) {
  using Acc = typename AccType<V>::type;
  const int64_t N = p.states, L = p.seq_len;
  const int64_t channels_per_group = p.dim / p.groups;
  std::mutex sums_lock;
  torch::stable::parallel_for(0, p.batch * p.groups, 1, [&](int64_t begin, int64_t end) {
    ChannelSums<Acc> sums(p);
    // Per step t of the span: the state before it, then per state the gradient carried back.
    std::vector<Acc> before(kCheckpointSteps * N), dh_carry(N);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / p.groups, g = bg % p.groups;
      for (int64_t d = g * channels_per_group; d < (g + 1) * channels_per_group; ++d) {
        const int64_t bd = b * p.dim + d;
        const Channel<V, BC, Acc> ch(p, bd);
        const bool per_segment = p.segment_of != nullptr;
        // The gradient of the state step t leaves, coming from outside the scan: d_last_state
        // (at the last step; with a state a segment, at each segment's last step).
        const auto d_leaving = [&](int64_t t, int64_t n) {
          if (!p.d_last_state) return Acc(0);
          return static_cast<const Acc*>(p.d_last_state)[per_segment ? ch.segment_state_at(ch.segment(t), n)
                                                                      : ch.state_at(n)];
        };
        for (int64_t n = 0; n < N; ++n) dh_carry[n] = d_leaving(L - 1, n);
        const Acc Dd = ch.D();
        for (int64_t span = num_checkpoints(L) - 1; span >= 0; --span) {
          const int64_t t0 = span * kCheckpointSteps, t1 = std::min(L, t0 + kCheckpointSteps);
          for (int64_t n = 0; n < N; ++n) before[n] = static_cast<const Acc*>(p.checkpoints)[ch.checkpoint_at(span, n)];
          for (int64_t t = t0; t + 1 < t1; ++t) {
            const Acc dt = ch.dt(ch.raw_dt(t)), u = ch.u(t);
            const bool cut = ch.cut(t);
            Acc* h = &before[(t - t0) * N];
            for (int64_t n = 0; n < N; ++n)
              h[N + n] = ch.decay(dt, n, cut) * ch.entering(h, n, t, cut) + dt * u * ch.B(n, t);
          }
          for (int64_t t = t1 - 1; t >= t0; --t) {
            const Acc raw = ch.raw_dt(t), dt = ch.dt(raw), u = ch.u(t);
            const Acc dy = ch.value(p.d_y, p.d_y_strides, t);
            const Acc sz = p.z ? sigmoid(ch.z(t)) : Acc(1);
            const Acc g_pre = p.z ? dy * ch.z(t) * sz : dy;  // the gradient of y before the gate
            const Acc* before_t = &before[(t - t0) * N];
            // At a cut, a = 0 (no gradient through it) or, with a state a segment, the state
            // entering is the segment's own; either way none is carried past it.
            const bool cut = ch.cut(t);
            Acc d_dt = 0, d_u = Dd * g_pre, y_pre = Dd * u;
            for (int64_t n = 0; n < N; ++n) {
              const Acc A = ch.A(n), a = ch.decay(dt, n, cut), Bn = ch.B(n, t), Cn = ch.C(n, t);
              const Acc h_prev = ch.entering(before_t, n, t, cut);
              const Acc h = a * h_prev + dt * u * Bn;
              y_pre += Cn * h;
              const Acc dh = Cn * g_pre + dh_carry[n];
              const Acc dB = dh * dt * u, dC = g_pre * h, w = dh * h_prev * a;
              d_dt += dh * Bn * u + w * A;
              d_u += dh * dt * Bn;
              sums.dA[d * N + n] += w * dt;
              if (p.b_per_step) static_cast<Acc*>(p.d_B)[((b * p.groups + g) * N + n) * L + ch.pos(t)] += dB;
              else sums.dB[d * N + n] += dB;
              if (p.c_per_step) static_cast<Acc*>(p.d_C)[((b * p.groups + g) * N + n) * L + ch.pos(t)] += dC;
              else sums.dC[d * N + n] += dC;
              dh_carry[n] = a * dh;
            }
            const Acc d_delta = d_dt * (p.delta_softplus ? sigmoid(raw) : Acc(1));
            const int64_t out = bd * L + ch.pos(t);
            static_cast<V*>(p.d_u)[out] = static_cast<V>(d_u);
            static_cast<V*>(p.d_delta)[out] = static_cast<V>(d_delta);
            if (p.z) static_cast<V*>(p.d_z)[out] = static_cast<V>(dy * y_pre * sz * (Acc(1) + ch.z(t) * (Acc(1) - sz)));
            sums.dD[d] += g_pre * u;
            sums.dbias[d] += d_delta;
            if (per_segment && cut) {  // dh_carry is the segment's d_initial; the step before ends another
              std::copy(dh_carry.begin(), dh_carry.end(),
                        static_cast<Acc*>(p.d_initial) + ch.segment_state_at(ch.segment(t), 0));
              if (t > 0)
                for (int64_t n = 0; n < N; ++n) dh_carry[n] = d_leaving(t - 1, n);
            }
          }
        }
        if (!per_segment)
          for (int64_t n = 0; n < N; ++n) static_cast<Acc*>(p.d_initial)[ch.state_at(n)] = dh_carry[n];
      }
    }
    const std::lock_guard<std::mutex> lock(sums_lock);
    sums.add_into(p);
  });
}

template <typename V, typename BC> struct Fwd { static void run(const SelectiveParams& p) { fwd<V, BC>(p); } };
template <typename V, typename BC> struct Bwd { static void run(const SelectiveGradParams& p) { bwd<V, BC>(p); } };

}  // namespace

void cpu_selective_fwd(const SelectiveParams& p, SelectiveStorage storage) {
  for_cpu_selective_storage<Fwd>(storage, p);
}
void cpu_selective_bwd(const SelectiveGradParams& p, SelectiveStorage storage) {
  for_cpu_selective_storage<Bwd>(storage, p);
}

}  // namespace linrec
