r"""Sparse autoencoders on one attention layer's output `z` (the heads
concatenated), on the project's induction model and on SmolLM2-135M.

  python -m experiments.sae --workdir=runs/sae                # induction
  python -m experiments.sae --config=configs/sae.py:smollm2 \
      --workdir=runs/sae_smollm2

"induction" (the default): trains the 2-layer model of configs/induction.py
(one seed, about a minute) unless runs/.../model holds it, then a
ReLU-L1, a TopK and a BatchTopK SAE (32x the 64-wide z of layer 1) per
seed, 3 seeds: L0, dead and dense features, explained variance, loss
recovered against zero and mean ablation, and the induction features
found on repeated random tokens; then a TopK SAE per seed on the layer's
resid_pre, and the controls of the induction-feature count (ReLU and
TopK). Committed in two runs on 2 quiet Intel Xeon cores: 19.2 min
without BatchTopK (59 min on 2 cores loaded by other jobs), then 5.7
min resuming it with BatchTopK.
"smollm2": a ReLU, a TopK and a BatchTopK SAE per seed, 3 seeds, on
layer 17 of SmolLM2-135M (the layer holding three of its four strongest
induction heads in docs/results/real_heads), text of the standard
library, 16x dictionaries, with the untrained-dictionary control, a ReLU
and a TopK SAE per seed on layer 0, one TopK SAE on the re-initialised
model and one on layer 17's resid_pre: about 4 h on 2 quiet Intel Xeon
cores from nothing (2 min to collect each site, 8 per ReLU and 12 per
TopK or BatchTopK SAE, 1.5 to 2 to measure each SAE and each control);
committed in four runs, 84, 73, 94 and 88 min, each resuming the one
before.
"smoke": a tiny induction model and tiny SAEs: 1 to 5 minutes (68 s
wall, 50 CPU s, on 2 AVX-512 AMD EPYC cores at load 2-3, 2026-12-04;
4 min 39 s on a loaded AVX2 machine).
"""

import ml_collections

from configs import induction

ARGS = (None, "smoke", "smollm2")


def _sae() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.kind = "relu"  # relu (L1) | topk | batchtopk; the run trains `kinds`
  s.d_sae = 2048  # F, dictionary size (32 x the 64-wide z)
  # ReLU: L1 coefficient, on inputs scaled to E|x|^2 = D. Anthropic's 5 at
  # D = 512, times sqrt(64 / 512) so that the shrinkage relative to |x|
  # is the same at D = 64.
  s.l1 = 2.0
  s.k = 16  # TopK: features kept per token
  s.aux_k = 256  # TopK: dead features used by the AuxK loss
  s.aux_coef = 1 / 32  # TopK: AuxK weight (Gao et al.)
  # BatchTopK (k per token on average over a batch): the weight of each
  # batch's smallest kept activation in the inference threshold's moving
  # average (SAELens's default).
  s.threshold_lr = 0.01
  s.learning_rate = 1e-3  # Adam
  s.beta2 = 0.999  # Adam beta2 (beta1 is 0)
  s.batch_size = 1024  # tokens per step
  s.num_steps = 3000
  s.topk_steps = 1500  # TopK's steps (0: num_steps); its loss is flat by
  # then and a TopK step is 3x a ReLU step here (the top-k on a CPU)
  s.dead_steps = 400  # a feature silent this many steps is dead
  s.resample_every = 600  # ReLU: resample dead features every ... steps
  s.resample_until = 0.6  # ... during this fraction of the run
  s.resample_pool = 8192  # inputs the resampling draws from
  s.checkpoint_every = 1000  # steps between checkpoints
  s.log_every = 200  # steps between metric rows
  s.seed = 0  # set per run from experiment.seeds
  return s


def get_config(arg=None):
  """The induction run; `arg` "smoke" or "smollm2" for the others."""
  if arg not in ARGS:
    raise ValueError(f"configs/sae.py: unknown config argument {arg!r}; "
                     "expected none (the full run) or 'smoke' (a tiny run of "
                     "1 to 5 minutes), or 'smollm2' (SmolLM2's layer 17)")
  c = ml_collections.ConfigDict()
  c.smoke = arg == "smoke"
  c.source = "smollm2" if arg == "smollm2" else "induction"
  # The model trained when source is induction (configs/induction.py).
  c.model = induction.get_config("smoke" if arg == "smoke" else None)
  c.model.experiment.seeds = (0,)
  c.sae = _sae()

  c.experiment = e = ml_collections.ConfigDict()
  e.layer = 1  # the layer whose z the SAEs read
  e.seeds = (0, 1, 2)  # SAE seeds (init and batch order), one model
  # BatchTopK beside the two of the issue: it lets a token's count of
  # features vary at TopK's average, which reconstructs better at the same
  # L0 (Bussmann et al. 2024; tests/sae/test_batchtopk.py measures it on
  # planted data), and SAELens saves it as JumpReLU, Gemma Scope's kind.
  e.kinds = ("relu", "topk", "batchtopk")
  # SAEs of these kinds (same seeds and sizes) also on the layer's
  # resid_pre, the stream entering it, the second site of Kissane et al.'s
  # comparison: sparsity, explained variance and loss recovered only.
  e.resid_pre_kinds = ("topk",)
  e.resid_pre_seeds = (0, 1, 2)
  e.train_batches = 250  # task batches collected for training (x 64 x 32)
  e.eval_batches = 16  # held-out task batches for the metrics
  e.drop_first = False  # leave out each window's first token
  e.data_seed = 0  # order of the text documents, repeated-token draws
  e.collect_batch = 16  # text windows per forward pass (smollm2)
  # Induction features, on repeated random tokens [x, x] (+ BOS).
  e.repeat_len = 14  # n tokens per copy
  e.repeat_inputs = 256
  e.loss_repeats = 0  # of them, the first ... for the loss on repeats (0: all)
  e.token_range = (3, 32)  # ids of the random tokens, [lo, hi)
  e.bos = -1  # a BOS id before the copies, -1 for none
  e.induction_threshold = 0.4  # a head is an induction head above this
  e.second_ratio = 5.0  # fires >= this x more on the second copy
  e.second_rate = 0.05  # ... and on at least this share of its tokens
  e.head_share = 0.5  # its DFA there comes >= this much from induction heads
  e.source_share = 0.5  # ... and from the token after the earlier copy
  e.random_draws = 20  # random feature sets, baseline of the reconstruction
  # The matched-direction null (induction.matched_null): each copying
  # feature's second-copy excess against `null_draws` random directions
  # with its norm on every head, on the first `null_inputs` inputs; a
  # feature is selective at p <= null_alpha.
  e.null_draws, e.null_inputs, e.null_alpha = 99, 64, 0.05
  # The threshold sweep: each varied alone, the others at the values
  # above; dfa_share sets head_share and source_share together.
  e.sweep_second_rate = (0.01, 0.02, 0.05, 0.1, 0.2)
  e.sweep_second_ratio = (1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
  e.sweep_dfa_share = (0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9)
  # Controls (experiments/sae/controls.py): the same SAEs and criterion on
  # layer `control_layer` (no induction heads), on the claim's layer of
  # the architecture re-initialised with `reinit_seed` and never trained,
  # and the claim's SAEs before training ("untrained").
  e.controls = ("layer0", "reinit", "untrained")
  e.control_layer = 0
  e.control_seeds = (0, 1, 2)  # SAE seeds of the trained controls
  e.control_kinds = ("relu", "topk")  # ... and their kinds (of `kinds`)
  # The re-initialised model's, where they differ (None: as above).
  e.reinit_seeds, e.reinit_kinds = None, None
  e.reinit_seed = 1000  # far from the trained model's seed 0
  # Each SAE's measures are saved in the workdir under a key of all they
  # depend on (experiments/sae/per_sae.py), so a run that adds SAEs
  # measures only those; False measures every SAE again.
  e.cache_measures = True
  e.top_contexts = 8  # contexts per feature in the viewer
  e.view_features = 12  # features on the viewer page
  # SmolLM2 (source smollm2).
  e.text_len = 128  # tokens per text window
  e.text_windows = 0  # training windows (set below)
  e.eval_windows = 0  # held-out windows for the metrics

  if arg == "smollm2":
    e.layer = 17
    e.seeds = (0, 1, 2)
    # ReLU and TopK, and BatchTopK as the induction model has it.
    e.kinds = ("relu", "topk", "batchtopk")
    # Layer 0, the layer without induction heads, has both kinds at 3
    # seeds as layer 17 has; the re-initialised model and the second site
    # have one TopK SAE each (seed 0): TopK's strict-DFA count is the one
    # the untrained control leaves standing, and every 16x TopK SAE costs
    # 12 min here. A resumed run reuses every SAE already trained.
    e.resid_pre_kinds, e.resid_pre_seeds = ("topk",), (0,)
    e.controls = ("layer0", "reinit", "untrained")
    e.control_seeds, e.control_kinds = (0, 1, 2), ("relu", "topk")
    e.reinit_seeds, e.reinit_kinds = (0,), ("topk",)
    e.text_windows = 1600  # 1600 x 127 = 203k tokens
    e.eval_windows = 32
    e.drop_first = True  # the first token of a window is an attention sink
    # 256 inputs for the induction criterion; the loss and KL on repeats
    # (three SmolLM2 forwards per batch per SAE) on the first 64.
    e.repeat_len, e.repeat_inputs, e.loss_repeats = 50, 256, 64
    e.token_range, e.bos = (1000, 32000), -1
    e.random_draws = 20
    e.top_contexts = 6
    s = c.sae
    # 16 x 576, the low end of Kissane et al.'s 16x-32x: a step takes
    # 0.3 s (ReLU) to 0.55 s (TopK with AuxK) on 2 quiet AVX-512 cores.
    s.d_sae = 9216
    s.k = 32
    s.batch_size = 1024
    # Chosen by L0 after 400 steps of seed 0 (docs/sae.md): coefficients
    # 1, 2, 3, 4, 5 gave L0 266, 106, 48, 25, 14; 3 is the one nearest
    # TopK's k = 32 from above, since L0 falls as training goes on.
    s.l1 = 3.0
    s.num_steps = 1500  # 1.5M token visits, 7.6 passes over the buffer
    s.topk_steps = 0
    s.resample_every, s.dead_steps = 300, 300
  if arg == "smoke":
    e.layer = 1
    # Fewer seeds on the second site and the trained controls, as the
    # SmolLM2 run has, so that their own seed lists are exercised.
    e.seeds, e.control_seeds, e.resid_pre_seeds = (0, 1), (0,), (1,)
    e.control_kinds = ("topk",)
    e.reinit_seeds = (1,)  # the re-initialised model's own list
    e.train_batches, e.eval_batches = 8, 2
    e.repeat_len, e.repeat_inputs, e.token_range = 4, 8, (3, 8)
    e.loss_repeats = 4
    e.random_draws, e.top_contexts, e.view_features = 3, 3, 3
    e.null_draws, e.null_inputs = 19, 4
    s = c.sae
    s.d_sae, s.k, s.aux_k, s.batch_size, s.num_steps = 32, 4, 8, 16, 12
    s.topk_steps = 0
    s.dead_steps, s.resample_every, s.resample_until = 3, 4, 0.7
    s.resample_pool, s.checkpoint_every, s.log_every = 32, 6, 4
  return c
