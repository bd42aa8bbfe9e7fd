"""Mutation testing of the core modules with cosmic-ray (`make mutation`).

cosmic-ray plants one small change (a mutant) at a time in a module ON
DISK and runs a test command; a mutant is killed when the command fails.
So this script first copies the working tree (tracked and untracked files,
not ignored ones) into a scratch folder and mutates only the copy. Python
run from the copy's root imports the copy's `mha_jax` (the current folder
comes first on sys.path, before the editable install of the checkout).

Each target below is one module, the functions (or lines) of it that are
mutated, and the fast test files that should notice. The operators that
only make noise on this code (bit shifts, powers, `is`, variable swaps)
are filtered out (KEEP_OPERATORS). A timeout counts as its own outcome.

    python scripts/mutate.py                   # every target
    python scripts/mutate.py --only masks,flash_rules
    python scripts/mutate.py --planted         # the planted bugs only

Besides cosmic-ray's operators, `PLANTED` holds bugs written by hand, the
slips a kernel's author makes that no operator plants (a block visited
twice, a wrong kv head, a table read at the wrong offset): each replaces
one exact piece of text in the copy, and its tests must fail.

Writes `<workdir>/summary.md` (counts per target and every survivor's diff)
and prints it. Not part of `make test`: each mutant costs a pytest start
and its compiles (9 to 40 s on 2 cores), so the 229 mutants of all
targets take one to two hours.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
PYTEST = f"{sys.executable} -m pytest -x -q -p no:cacheprovider"

_FLASH_K = "grid or fully_masked or bf16 or visits or through_multi_head"
_FLASH_TESTS = f"tests/core/test_flash.py -k '{_FLASH_K}'"

# name -> (module, functions mutated, regex of other lines mutated, tests,
#          whether NumberReplacer runs)
TARGETS = {
    "masks": ("mha_jax/core/masks.py",
              ["causal_mask", "padding_mask", "combine_masks"], None,
              "tests/core/test_masks.py", True),
    # The reference paths and their softmax (core/attention.py before the
    # split by concern), and the path record's refusals.
    "softmax": ("mha_jax/core/softmax.py",
                ["softmax_rows", "_softmax_rows_jvp", "masked_softmax"],
                None, "tests/core/test_attention.py", False),
    "reference": ("mha_jax/core/reference.py",
                  ["_head_scores", "_head_mix", "_weights", "_attend_vmap",
                   "_attend_einsum"], None,
                  "tests/core/test_attention.py", False),
    "attention_path": ("mha_jax/core/attention_path.py", ["refusal"], None,
                       "tests/core/test_attention_path.py", False),
    # The kernel's masking, causal block skipping and backward pass (where
    # the planted bugs of issue 18 sat); the forward's online softmax is
    # also checked by every grid case, but left out to keep a run short.
    # The kernel is several files, so several targets with the same tests.
    "flash": ("mha_jax/core/kernels/flash_kernel.py", ["backward"], None,
              _FLASH_TESTS, False),
    "flash_rules": ("mha_jax/core/kernels/flash_kernel.py",
                    ["block_scores"], None, _FLASH_TESTS, False),
    # The walk also serves block masks (`visited_blocks` cuts their lists)
    # and context parallelism (keys from a later start), which the flash
    # selection alone never reaches: 15 of 26 mutants survived it.
    "flash_visit": ("mha_jax/core/kernels/flash_visit.py",
                    ["_key_range", "kv_block_range", "visited_blocks"], None,
                    "tests/core/test_flash.py tests/core/test_block_mask.py "
                    f"tests/parallel/test_context.py -k '{_FLASH_K} or "
                    "sub_blocks or ring_block_range or visited_blocks'",
                    False),
    # The span walk of a banded block mask: its plan (which blocks a query
    # block's one step covers) and the step itself.
    "span_plan": ("mha_jax/core/kernels/flash_schedule.py", ["span_plan"],
                  None, "tests/core/test_span_walk.py", True),
    "span_walk": ("mha_jax/core/kernels/flash_schedule.py",
                  ["span_walk", "span_blocks"], None,
                  "tests/core/test_span_walk.py", False),
    # A broadcast mask or bias cut into blocks, and the bias' gradient
    # summed back to its shape (flash_rules' block cut and the backward's
    # sums, in the kernel's file before it was split).
    "flash_backward": ("mha_jax/core/kernels/flash_broadcast.py",
                       ["slice_block", "reduce_to", "add_bias_block"], None,
                       _FLASH_TESTS, False),
    "multi_head": ("mha_jax/core/multi_head.py", ["attention_layer"], None,
                   "tests/core/test_kv_cache.py tests/core/test_multi_head.py", False),
    "kv_cache": ("mha_jax/core/kv_cache.py",
                 ["positions", "update", "overflowed", "status"], None,
                 "tests/core/test_kv_cache.py", True),
    # The training loop's key handling: the streams, the dropout key of a
    # step (train_state.py) and the data key of a step (the loop's lines
    # that use it, train.py).
    "train_state": ("mha_jax/training/train_state.py",
                    ["seed_key", "train_step"], r"fold_in",
                    "tests/training/test_train.py -k 'resumed or dropout_key'",
                    True),
    "train": ("mha_jax/training/train.py", [], r"data_key|fold_in|range\(start",
              "tests/training/test_train.py -k 'resumed or dropout_key'", True),
    # The interpretability layer and what its numbers rest on (issue 33):
    # a patch's order, index checks and slices; patching's swaps, one-hot
    # positions and attribution; composition's products and baselines;
    # the score rules' masks and biases; the statistics; the corpus index.
    "hooks": ("mha_jax/hooks/sites.py", ["_compose", "_check_value"], None,
              "tests/test_hooks.py", True),
    "hook_patches": ("mha_jax/hooks/patches.py",
                     ["_static_index", "_in_range", "_selector", "_fits",
                      "_value"], None, "tests/test_hooks.py", True),
    "patching": ("mha_jax/interp/patching.py",
                 ["_score", "_swap", "_one_hot", "_replace_at", "_patch_grid",
                  "attribution_patching"], None,
                 "tests/interp/test_patching.py", False),
    "composition": ("mha_jax/interp/composition.py",
                    ["frobenius_ratio", "centring", "ov_circuits",
                     "qk_circuits", "_scores", "composition_baseline",
                     "copying_score"], None,
                    "tests/interp/test_composition.py", False),
    "score_rules": ("mha_jax/core/score_rules.py",
                    ["alibi_slopes", "default_q_positions", "distance",
                     "allowed", "scores"], None,
                    "tests/core/test_score_rules.py", False),
    "stats": ("mha_jax/measure/stats.py",
              ["mean_std", "t_interval", "summary", "difference",
               "detectable_difference", "bootstrap_interval"], None,
              "tests/measure/test_stats.py", True),
    "text_corpus": ("mha_jax/training/text_corpus.py",
                    ["locate", "_cut", "split_of", "byte_counts"], None,
                    "tests/training/test_text.py", True),
    # The BPE corpus: windows, starts, the byte table and the counts.
    "text_tokens": ("mha_jax/training/text_tokens.py",
                    ["_byte_level_map", "windows", "_encode", "_split",
                     "counts", "check_vocab"], None,
                    "tests/training/test_text_tokens.py", True),
}

_PALLAS_GPU_TESTS = "tests/core/test_pallas_gpu.py"
_PALLAS_GPU = "mha_jax/core/kernels/pallas_gpu.py"
_PALLAS_GPU_PLAN = "mha_jax/core/kernels/pallas_gpu_plan.py"
_PALLAS_GPU_KERNELS = "mha_jax/core/kernels/pallas_gpu_kernels.py"
_PATCHING = "mha_jax/interp/patching.py"
_POSITIONS = "mha_jax/interp/patch_positions.py"
_POSITIONS_TESTS = "tests/interp/test_patching_positions.py"
_EAP = "mha_jax/interp/eap.py"
_EAP_GRAPH = "mha_jax/interp/eap_graph.py"
_EAP_TESTS = "tests/interp/test_eap.py"
_IOI_CIRCUIT = "experiments/ioi_task/knockout.py"
_IOI_CIRCUIT_RUN = "experiments/ioi_circuit/run.py"
_IOI_CIRCUIT_TESTS = "tests/experiments/test_ioi_circuit.py"
_IOI_HEADS = "experiments/ioi_output_heads/"
_IOI_HEADS_TESTS = "tests/experiments/test_ioi_output_heads.py"
_IOI_CLASSES = "experiments/ioi_classes/run.py"
_IOI_CLASSES_TESTS = "tests/experiments/test_ioi_classes.py"
_SAE_INDUCTION = "experiments/sae/induction.py"
_SAE_CONTROLS_TESTS = "tests/sae/test_induction_controls.py"
_SAE_ATTRIBUTION = "mha_jax/sae/attribution.py"
_SAE_PAGE_JS = "mha_jax/interp/explorer_static/page.js"
_SAE_EXPLORER_TESTS = "tests/interp/test_explore_sae.py"
_EAP_IOI = "experiments/eap_ioi/circuits.py"
_EAP_IOI_TESTS = "tests/experiments/test_eap_ioi.py"
_EAP_TORCH = "experiments/eap_ioi/torch_eap.py"
_EAP_TORCH_TESTS = "tests/experiments/test_torch_eap.py"
_SAE_LIB = "mha_jax/sae/sae.py"
_SAE_TRAIN = "mha_jax/sae/train.py"
_SAE_BATCHTOPK_TESTS = "tests/sae/test_batchtopk.py"
# name -> (module, exact text, its replacement, tests that must fail)
PLANTED = {
    # The train-step benchmark's torch peers compute with denormals, which
    # XLA flushes (on Intel CPUs torch's step then slows round by round).
    "benchmark_torch_keeps_denormals": (
        "experiments/benchmark/train_step.py",
        "  torch.set_flush_denormal(True)\n",
        "",
        "tests/experiments/test_train_step_bench.py"),
    # The roofline's share taken against the yardstick's previous round
    # (a change of load then falls on one side of the ratio only).
    "roofline_share_of_another_round": (
        "mha_jax/measure/roofline.py",
        "for t, y in zip(times, yard_times)]",
        "for t, y in zip(times, yard_times[1:] + yard_times[:1])]",
        "tests/measure/test_roofline.py"),
    # Decoding's work counted as the weights read once, not once a token.
    "real_lm_decode_reads_the_weights_once": (
        "experiments/real_lm_bench/run.py",
        'out["decode"] = e.new_tokens * roofline.param_bytes(model)',
        'out["decode"] = 1 * roofline.param_bytes(model)',
        "tests/experiments/test_real_lm_bench.py"),
    # The compiled count reads a scan's body once, not once per step.
    "compiled_flops_ignore_the_trip_count": (
        "mha_jax/core/flops.py",
        "total += int(trip.group(1)) * sum(",
        "total += 1 * sum(",
        "tests/core/test_flops.py"),
    # The compiled count multiplies by the rhs's contracted dims where
    # the lhs's are meant: right only when both operands agree, as for a
    # square weight.
    "compiled_flops_contract_the_wrong_operand": (
        "mha_jax/core/flops.py",
        'lhs = re.match(r"\\s*%([^\\s,)]+)", rest).group(1)',
        'lhs = re.search(r",\\s*%([^\\s,)]+)", rest).group(1)',
        "tests/core/test_flops.py"),
    # The window's work counted as full rows from the first query on (the
    # first window - 1 queries see fewer keys).
    "score_rules_window_work_ignores_the_start": (
        "experiments/score_rules_bench/run.py",
        "return w * (w + 1) // 2 + (n - w) * w",
        "return n * w",
        "tests/experiments/test_score_rules_bench.py"),
    # MiniLM's share taken against the yardstick's rate in another round.
    "minilm_share_of_another_round": (
        "experiments/pretrained_bench/run.py",
        "roofline.share(work[t], x, yard_flops, yard_times)",
        "roofline.share(work[t], x, yard_flops, yard_times[::-1])",
        "tests/pretrained/test_pretrained_bench.py"),
    # The stream yardstick's bytes counted as bfloat16.
    "stream_yardstick_counts_half_the_bytes": (
        "mha_jax/measure/roofline.py", "rows * cols * 4\n", "rows * cols * 2\n",
        "tests/measure/test_roofline.py"),
    # TopK keeps every entry equal to the k-th value (k + 1 or more
    # features where values tie), not the first ones by index.
    "sae_topk_keeps_every_tie": (
        "mha_jax/sae/sae.py",
        "keep = (f > kth) | ((f == kth) & (index <= last))",
        "keep = f >= kth", "tests/sae/test_sae.py"),
    # TopK's mask drops a NaN pre-activation, so the loss stays finite.
    "sae_topk_hides_a_nan": (
        "mha_jax/sae/sae.py", " | jnp.isnan(f)\n", "\n",
        "tests/sae/test_sae.py"),
    # The weight product's derivative without its barrier: XLA folds the
    # transposed copy back into the dot, which is then Eigen's again.
    "weight_product_without_its_barrier": (
        "mha_jax/core/weight_product.py",
        "xt = lax.optimization_barrier(rows.T)", "xt = rows.T",
        "tests/core/test_weight_product.py"),
    # A chunk of the batch gives the user rules its own row numbers from
    # 0, not the call's: row 5 of a batch reads rule row 1.
    "batch_chunks_rows_count_from_zero": (
        "mha_jax/core/reference.py",
        "rules, row0 + jnp.arange(b).reshape(b, 1, 1, 1, 1),",
        "rules, jnp.arange(b).reshape(b, 1, 1, 1, 1),",
        "tests/core/test_batch_chunks.py"),
    # Chunks in a process of several devices, cutting across a data
    # mesh's shards of the batch.
    "batch_chunks_across_devices": (
        "mha_jax/core/batch_chunks.py",
        'jax.default_backend() != "cpu" or jax.device_count() > 1 or b < 2',
        'jax.default_backend() != "cpu" or b < 2',
        "tests/core/test_batch_chunks.py"),
    # Chunks cut the batch at the wrong edges: the last row is dropped
    # and the first counted twice.
    "batch_chunks_bounds_off_by_one": (
        "mha_jax/core/batch_chunks.py",
        "edges = [b * i // n for i in range(n + 1)]",
        "edges = [max(0, b * i // n - 1) for i in range(n + 1)]",
        "tests/core/test_batch_chunks.py"),
    # glibc trims a freed heap top over 2 GiB again (the largest int).
    "host_memory_trims_above_2_gib": (
        "mha_jax/training/host_memory.py", "_KEEP = -1",
        "_KEEP = 2 ** 31 - 1", "tests/training/test_host_memory.py"),
    # Its activation term differentiates through x instead of dx.
    "weight_product_tangent_of_the_wrong_input": (
        "mha_jax/core/weight_product.py",
        "terms.append(lax.dot_general(dx, w, _dims(dx), precision=prec))",
        "terms.append(lax.dot_general(x, w, _dims(x), precision=prec))",
        "tests/core/test_weight_product.py"),
    # The products benchmark calls a plain dot (Eigen) a YNNPACK one.
    "attention_products_blames_the_wrong_kernel": (
        "experiments/benchmark/attention_products.py",
        'd["kernel"] = kernel_of.get(d["computation"], "Eigen")',
        'd["kernel"] = kernel_of.get(d["computation"], "YNNPACK")',
        "tests/experiments/test_attention_products.py"),
    # Its torch operands contract the lhs's first free dim, not its
    # contracting one.
    "attention_products_gemm_reads_the_wrong_axis": (
        "experiments/benchmark/attention_products.py",
        "return (lhs.transpose(*dot[\"lhs_batch\"], *lhs_free, lc),",
        "return (lhs.transpose(*dot[\"lhs_batch\"], lc, *lhs_free),",
        "tests/experiments/test_attention_products.py"),
    # BatchTopK keeps k over the whole batch instead of k per token on
    # average.
    "sae_batchtopk_keeps_k_not_k_times_n": (
        _SAE_LIB, "keep_largest(f.reshape(1, -1), k * f.shape[0])",
        "keep_largest(f.reshape(1, -1), k)", _SAE_BATCHTOPK_TESTS),
    # The jump lets a pre-activation equal to its threshold through.
    "sae_jump_at_the_threshold": (
        _SAE_LIB, "jnp.where(pre > threshold[None], jax.nn.relu(pre), 0.0)",
        "jnp.where(pre >= threshold[None], jax.nn.relu(pre), 0.0)",
        _SAE_BATCHTOPK_TESTS),
    # The threshold's moving average weighted the wrong way round.
    "sae_threshold_average_swapped": (
        _SAE_TRAIN,
        "new = (1 - hp.threshold_lr) * old + hp.threshold_lr * kept_min",
        "new = hp.threshold_lr * old + (1 - hp.threshold_lr) * kept_min",
        _SAE_BATCHTOPK_TESTS),
    # SAELens's JumpReLU read without its threshold tensor's values: each
    # feature's threshold taken as the first one's.
    "saelens_threshold_first_only": (
        "mha_jax/sae/saelens.py",
        "    arrays = {ours: f.get_tensor(theirs)",
        "    arrays = {ours: (f.get_tensor(theirs) if ours != 'threshold' "
        "else np.full_like(f.get_tensor(theirs), f.get_tensor(theirs)[0]))",
        "tests/sae/test_saelens.py"),
    # SAE induction features. The second/first-copy ratio dropped: a
    # feature that fires as much on the first copy counts as induction.
    "sae_ratio_criterion_dropped": (
        _SAE_INDUCTION, ">= second_ratio * stats[\"mean_first\"])",
        ">= 0 * second_ratio * stats[\"mean_first\"])",
        _SAE_CONTROLS_TESTS),
    # The sweep's DFA share moves the source threshold only, leaving the
    # head share at the claim's value.
    "sae_sweep_dfa_share_source_only": (
        _SAE_INDUCTION,
        'names = ("head_share", "source_share") if name == "dfa_share"',
        'names = ("source_share",) if name == "dfa_share"',
        _SAE_CONTROLS_TESTS),
    # The DFA at the induction source summed over every second-copy
    # position, not only where the feature fires.
    "sae_source_dfa_over_all_positions": (
        _SAE_INDUCTION, '"dfa_src": jnp.sum(at_src * w, (0, 1))',
        '"dfa_src": jnp.sum(at_src, (0, 1))', _SAE_CONTROLS_TESTS),
    # A control whose best seed ties the claim's worst counts as separated.
    "sae_separation_on_ties": (
        "experiments/sae/report_controls.py", "      if low > high:",
        "      if low >= high:", _SAE_CONTROLS_TESTS),
    # The features a head writes most (the explorer's head panel). A
    # head's block read across the heads: columns h, h + H, ... taken as
    # head h's part of z, as if z were laid out head-minor.
    "sae_head_share_wrong_axis": (
        _SAE_ATTRIBUTION,
        "sq = jnp.sum(w_dec.reshape(f, num_heads, -1) ** 2, -1)",
        "sq = jnp.sum(w_dec.reshape(f, -1, num_heads) ** 2, 1)",
        _SAE_EXPLORER_TESTS),
    # The features a head writes least listed first.
    "sae_head_tops_ascending": (
        _SAE_ATTRIBUTION, "np.argsort(-sub, axis=0, kind=\"stable\")",
        "np.argsort(sub, axis=0, kind=\"stable\")", _SAE_EXPLORER_TESTS),
    # A head's feature button opens the feature at its position in the
    # head's list, not the feature's index in the panel.
    "sae_head_feature_button_opens_list_position": (
        _SAE_PAGE_JS, "selectFeature(t.feature);",
        "selectFeature(row.features.indexOf(t));", _SAE_EXPLORER_TESTS),
    # ... or the feature's id taken for its index in the panel.
    "sae_head_feature_button_opens_id_as_index": (
        _SAE_PAGE_JS, "selectFeature(t.feature);", "selectFeature(t.id);",
        _SAE_EXPLORER_TESTS),
    # The full blocks also stay on the partial list: each is visited twice.
    "pallas_gpu_block_visited_twice": (
        _PALLAS_GPU_PLAN, '(("", visit & ~full, visit & full)',
        '(("", visit, visit & full)', _PALLAS_GPU_TESTS),
    # mask_mod evaluated on full blocks too: what the block mask says of a
    # block is no longer trusted (FlexAttention trusts it).
    "pallas_gpu_mask_on_full_blocks": (
        _PALLAS_GPU_KERNELS,
        "if spec.mask_mod is not None and not full:",
        "if spec.mask_mod is not None:", _PALLAS_GPU_TESTS),
    # mask_mod skipped on partial blocks (kept on full ones, where it
    # allows every key anyway).
    "pallas_gpu_mask_skipped_on_partial_blocks": (
        _PALLAS_GPU_KERNELS,
        "if spec.mask_mod is not None and not full:",
        "if spec.mask_mod is not None and full:", _PALLAS_GPU_TESTS),
    # The gradient of a rule's float array (a bias table) dropped.
    "pallas_gpu_rule_array_gradient_dropped": (
        _PALLAS_GPU, 'd_ex["floats"] = tuple(jnp.sum(s, (0, 1, 2))',
        'd_ex["floats"] = tuple(0 * jnp.sum(s, (0, 1, 2))',
        _PALLAS_GPU_TESTS),
    # A rule's integer table (document ids [B, T]) read at the wrong flat
    # offset: the strides of its shape dropped.
    "pallas_gpu_table_read_at_wrong_offset": (
        "mha_jax/core/kernels/pallas_gpu_tables.py",
        "flat = flat + start * int(stride)", "flat = flat + start",
        _PALLAS_GPU_TESTS),
    # Segments skip the wrong blocks: a block whose queries and keys
    # share a segment is skipped (one that shares none is visited).
    "pallas_gpu_segment_skip_inverted": (
        _PALLAS_GPU_KERNELS,
        "return (jnp.min(q) <= jnp.max(k)) & (jnp.min(k) <= jnp.max(q))",
        "return ~((jnp.min(q) <= jnp.max(k)) & (jnp.min(k) <= jnp.max(q)))",
        _PALLAS_GPU_TESTS),
    # GQA reading the wrong kv head (h % G instead of h // G).
    "pallas_gpu_wrong_kv_head": (
        _PALLAS_GPU, "  return h // groups\n", "  return h % groups\n",
        _PALLAS_GPU_TESTS),
    # Per-example positions (issue: roles at their own position in each
    # example). The first example's positions applied to every example.
    "positions_of_the_first_example": (
        _POSITIONS, "  return mask.reshape(shape)\n",
        "  return jnp.broadcast_to(mask[:1], mask.shape).reshape(shape)\n",
        _POSITIONS_TESTS),
    # A position set read transposed ([T, B] laid out as [B, T]).
    "positions_transposed": (
        _POSITIONS, "  return mask.reshape(shape)\n",
        "  return mask.T.reshape(shape)\n", _POSITIONS_TESTS),
    # Attribution summed over the first example's positions only.
    "attribution_positions_of_the_first_example": (
        _POSITIONS, "positions.astype(est.dtype))",
        "jnp.broadcast_to(positions[:, :1], positions.shape).astype("
        "est.dtype))", _POSITIONS_TESTS),
    # The raw per-example metrics averaged over the examples.
    "per_example_outputs_averaged": (
        _PATCHING, "  if normalise:\n    m = _score(m, reference, noising)\n",
        "  if normalise:\n    m = _score(m, reference, noising)\n  else:\n"
        "    m = jnp.broadcast_to(m.mean(-1, keepdims=True), m.shape)\n",
        _POSITIONS_TESTS),
    "per_example_estimates_averaged": (
        _PATCHING, "    m = _lead(m_target, est) + est\n",
        "    m = _lead(m_target, est) + est\n    if per_example:\n"
        "      m = jnp.broadcast_to(m.mean(-1, keepdims=True), m.shape)\n",
        _POSITIONS_TESTS),
    # A sender's change kept to the first example's positions.
    "sender_positions_of_the_first_example": (
        _PATCHING, "jnp.where(at[:, :, None, None], delta, 0.0)",
        "jnp.where(at[:1, :, None, None], delta, 0.0)", _POSITIONS_TESTS),
    # IOI's source run started late from the target's stream too.
    "ioi_source_run_started_late": (
        "experiments/ioi/head_patching.py",
        'later = {} if patch is None else {"start": start,',
        'later = {} if False else {"start": start,',
        "tests/experiments/test_ioi_patching.py"),
    # Edge attribution patching. Each receiver's gradient taken at the
    # stream its group shares (every query head of a layer, say) instead
    # of its own input.
    "eap_gradient_at_shared_stream": (
        _EAP, "return x if eps is None else x + eps[group_index[group.start]]",
        "return x if eps is None else x + jnp.sum(eps[group_index["
        "group.start]], 2, keepdims=True)", _EAP_TESTS),
    # The receivers' gradients joined in the wrong order (the groups'
    # zeros are one array each, concatenated for the score product).
    "eap_gradients_out_of_order": (
        _EAP, "for g in grads], axis=0)", "for g in grads[::-1]], axis=0)",
        _EAP_TESTS),
    # The heads' terms recorded only in the runs that do not remove edges:
    # a circuit's run then misses the heads' senders.
    "eap_head_terms_not_recorded": (
        _EAP, "    if drop is not None:\n      # Only a run",
        "    if drop is None:\n      # Only a run", _EAP_TESTS),
    # The removed edges' change taken off a receiver's stream twice.
    "eap_removed_edges_counted_twice": (
        _EAP, "x = x - jnp.moveaxis(rows",
        "x = x - 2 * jnp.moveaxis(rows", _EAP_TESTS),
    # Every group of a shared product reads the first group's rows (a
    # layer's k and v receivers get its query heads' removed edges).
    "eap_shared_product_rows": (
        _EAP, "rows = removed[group.start - lo:group.start - lo + group.size]",
        "rows = removed[:group.size]", _EAP_TESTS),
    # Each block of senders' change measured against the source rows of
    # the block before it (an off-by-a-block offset into the source).
    "eap_source_rows_shifted": (
        _EAP, "- source_rows[start:start + n])",
        "- source_rows[max(start - n, 0):max(start - n, 0) + n])",
        _EAP_TESTS),
    # A key or value receiver cut to the head its query mapping names
    # (query head i's key/value head), not to key/value head i.
    "eap_head_inputs_kv_by_query": (
        _EAP, "else (index * group, index))",
        "else (index, index // group))", _EAP_TESTS),
    # Clean minus corrupted: every score's sign flipped.
    "eap_sign_flipped": (
        _EAP, "delta = (a_corrupt - a_clean).reshape(",
        "delta = (a_clean - a_corrupt).reshape(", _EAP_TESTS),
    # A receiver also reads the senders of its own stage: edges from a head
    # to the heads of its own layer, run backwards in the computation.
    "eap_edge_runs_backwards": (
        _EAP_GRAPH, "  return written_at < read_at",
        "  return written_at <= read_at", _EAP_TESTS),
    # EAP-IG's points from the corrupted end (k = 0..steps-1): never at
    # the clean run, so one step is no longer EAP.
    "eap_ig_points_start_at_corrupted": (
        _EAP, "alphas = jnp.arange(1, steps + 1, dtype=a_clean.dtype) / steps",
        "alphas = jnp.arange(0, steps, dtype=a_clean.dtype) / steps",
        _EAP_TESTS),
    # The circuit's own edges ablated instead of the others.
    "eap_kept_edges_ablated": (
        _EAP, "drop = (exists & ~m.astype(bool))",
        "drop = (exists & m.astype(bool))", _EAP_TESTS),
    # Mean ablation averaged over positions instead of over the batch.
    "eap_mean_over_positions": (
        _EAP, "jnp.mean(_sender_rows(model, mean_inputs), axis=1",
        "jnp.mean(_sender_rows(model, mean_inputs), axis=2", _EAP_TESTS),
    # Circuits of the largest signed scores, not the largest |score|.
    "eap_top_edges_by_signed_score": (
        _EAP_GRAPH, "jnp.where(exists, jnp.abs(scores.scores), -jnp.inf)",
        "jnp.where(exists, scores.scores, -jnp.inf)", _EAP_TESTS),
    # The knockout's mean taken over every prompt, not each template's.
    "ioi_circuit_mean_over_all_templates": (
        _IOI_CIRCUIT, "out[:, rows] = z[:, rows].mean(1, keepdims=True)",
        "out[:, rows] = z.mean(1, keepdims=True)", _IOI_CIRCUIT_TESTS),
    # A resampled prompt may read its own activations (a shift of 0).
    "ioi_circuit_resample_self": (
        _IOI_CIRCUIT, "np.roll(order, -int(rng.integers(1, len(rows))))",
        "np.roll(order, -int(rng.integers(0, len(rows))))",
        _IOI_CIRCUIT_TESTS),
    # The kept heads replaced and the knocked ones left live.
    "ioi_circuit_keep_inverted": (
        _IOI_CIRCUIT,
        "jnp.where(keep[None, None, :, None], z, replacement.astype(z.dtype))",
        "jnp.where(keep[None, None, :, None], replacement.astype(z.dtype), z)",
        _IOI_CIRCUIT_TESTS),
    # Completeness compares F(C \ K) with the whole model, not F(M \ K).
    "ioi_circuit_completeness_against_whole_model": (
        _IOI_CIRCUIT_RUN, "without_m = f(knockout.keep_mask(shape, k))",
        "without_m = f(knockout.keep_mask(shape, []))", _IOI_CIRCUIT_TESTS),
    # Minimality's K holds v itself, so removing v changes nothing.
    "ioi_circuit_minimality_k_holds_v": (
        _IOI_CIRCUIT_RUN,
        "rest = [tuple(x) for x in heads if tuple(x) != v]",
        "rest = [tuple(x) for x in heads]", _IOI_CIRCUIT_TESTS),
    # IOI output heads. The relative floor measured against the weakest
    # admissible head instead of the strongest: every head joins.
    "ioi_heads_floor_of_the_weakest": (
        "experiments/ioi_task/groups.py", "  top = m[order[0]]\n",
        "  top = m[order[-1]]\n", _IOI_HEADS_TESTS),
    # Copy suppression in context: the head's attention read backwards.
    "ioi_heads_attention_read_backwards": (
        _IOI_HEADS + "head_effects.py",
        'attends_io = m["end_io"] > m["end_s"]',
        'attends_io = m["end_io"] < m["end_s"]', _IOI_HEADS_TESTS),
    # The other-names baseline also averages IO and S.
    "ioi_heads_baseline_includes_the_prompts_names": (
        _IOI_HEADS + "head_effects.py",
        "& (name_ids[None] != s[:, None])).astype(jnp.float32)",
        "| True).astype(jnp.float32)", _IOI_HEADS_TESTS),
    # OV ranks that count ties for the token: a head writing nothing
    # suppresses every token most.
    "ioi_heads_ties_count_as_suppressed": (
        _IOI_HEADS + "ov_circuit.py", "vocab = jnp.sum(logits <= own, -1) - 1",
        "vocab = jnp.sum(logits < own, -1)", _IOI_HEADS_TESTS),
    # The interval "over templates" drawn over prompts.
    "ioi_heads_templates_drawn_as_prompts": (
        "experiments/ioi_task/halves.py",
        "bootstrap.group_weights(template, resamples",
        "bootstrap.group_weights(np.arange(len(template)), resamples",
        _IOI_HEADS_TESTS),
    # IOI upstream classes. The random sets drawn from every sender, the
    # class's own heads included.
    "ioi_classes_random_sets_hold_the_class": (
        _IOI_CLASSES,
        "pool = np.setdiff1d(senders, sorted(set(named) | set(members)))",
        "pool = senders", _IOI_CLASSES_TESTS),
    # The held-out test run on the selection prompts.
    "ioi_classes_confirmed_on_the_selection_half": (
        _IOI_CLASSES, "got = path_effects(model, p, held, receivers, sets,",
        "got = path_effects(model, p, sel, receivers, sets,",
        _IOI_CLASSES_TESTS),
    # A class that failed its held-out test still receives the next round.
    "ioi_classes_unconfirmed_class_feeds_the_next_round": (
        _IOI_CLASSES, 'heads_of[rname] = r["heads"] if ok else []',
        'heads_of[rname] = r["heads"]', _IOI_CLASSES_TESTS),
    # Under GQA a query head's keys and values taken at the kv head of its
    # own index, not its group's.
    "ioi_classes_kv_head_of_the_query_index": (
        _IOI_CLASSES, "return tuple(sorted({(int(l), int(h) // per, x)",
        "return tuple(sorted({(int(l), min(int(h), n_kv - 1), x)",
        _IOI_CLASSES_TESTS),
    # A set of senders sends only its first layer's heads.
    "ioi_paths_set_sends_one_layer": (
        "experiments/ioi_task/paths.py", "        on = sender[j]\n",
        "        on = sender[j] & (j == jnp.argmax(sender.any(-1)))\n",
        _IOI_CLASSES_TESTS),
    # The EAP-on-IOI experiment. The held-out prompts start one early:
    # the first of them was also scored.
    "eap_ioi_split_overlaps": (
        _EAP_IOI, "np.sort(order[score:score + held_out])",
        "np.sort(order[score - 1:score - 1 + held_out])", _EAP_IOI_TESTS),
    # A kv head's k and v taken to serve only the query head of its own
    # index, not its whole group.
    "eap_ioi_kv_serves_one_head": (
        _EAP_IOI, "{(g.layer, h) for h in range(i * per, (i + 1) * per)}",
        "{(g.layer, i)}", _EAP_IOI_TESTS),
    # The hand-built circuit without the path-patching rounds' heads (the
    # classes are read by the shared IOI task's circuit module).
    "eap_ioi_hand_built_skips_paths": (
        "experiments/ioi_task/circuit.py",
        "(entry if where is None else entry.get(where, {}))",
        "(entry if where is None else {})", _EAP_IOI_TESTS),
    # Random circuits drawn with replacement: fewer edges than their size.
    "eap_ioi_random_with_replacement": (
        _EAP_IOI, "size=int(k), replace=False)", "size=int(k), replace=True)",
        _EAP_IOI_TESTS),
    # Heads ranked by their edges' signed scores, which cancel.
    "eap_ioi_heads_by_signed_score": (
        _EAP_IOI, "values = np.abs(np.asarray(scores.scores)) * scores.exists",
        "values = np.asarray(scores.scores) * scores.exists", _EAP_IOI_TESTS),
    # The curve's area without the full circuit's point (1 at fraction 1).
    "eap_ioi_curve_drops_full_circuit": (
        _EAP_IOI, "full = np.concatenate([0 * ones, faith, ones], -1)",
        "full = np.concatenate([0 * ones, faith, 0 * ones], -1)",
        _EAP_IOI_TESTS),
    # The benchmark's torch chunks weighted by the full chunk size: a
    # short last chunk counts as a full one.
    "eap_torch_chunk_weight": (
        "experiments/eap_ioi/bench.py", "* (len(rows) / n)",
        "* (size / n)", _EAP_TORCH_TESTS),
    # The torch peer of EAP (checked against mha_jax's scores). Each
    # receiver's gradient taken at the stream its group shares (every
    # query head of a layer, say) instead of its own copy.
    "eap_torch_gradient_at_shared_stream": (
        _EAP_TORCH, "copies if groups is None else copies + next(groups)",
        "copies if groups is None else copies + next(groups).sum(2, "
        "keepdim=True)", _EAP_TORCH_TESTS),
    # Clean minus corrupted: every score's sign flipped.
    "eap_torch_sign_flipped": (
        _EAP_TORCH, "delta = a_corrupt - a_clean",
        "delta = a_clean - a_corrupt", _EAP_TORCH_TESTS),
    # Query head h read with kv head h % K instead of h // (H / K): the
    # k and v receivers serve the wrong query heads.
    "eap_torch_kv_head_by_query_head": (
        _EAP_TORCH, "kv_of = torch.arange(h) // (h // k)",
        "kv_of = torch.arange(h) % k", _EAP_TORCH_TESTS),
    # Values computed before keys: they take the k receivers' copies of
    # the stream, so the k and v scores trade places (the forward is
    # unchanged).
    "eap_torch_k_and_v_receivers_swapped": (
        _EAP_TORCH,
        "    key = _rotate(_per_head(attn.k_proj, _rms(norm, own(k)), k), cos, "
        "sin)\n    value = _per_head(attn.v_proj, _rms(norm, own(k)), k)",
        "    value = _per_head(attn.v_proj, _rms(norm, own(k)), k)\n    key = "
        "_rotate(_per_head(attn.k_proj, _rms(norm, own(k)), k), cos, sin)",
        _EAP_TORCH_TESTS),
    # EAP-IG's points from the corrupted end (k = 0..steps-1), not
    # eap.py's k = 1..steps.
    "eap_torch_ig_points_start_at_corrupted": (
        _EAP_TORCH, "for i in range(1, steps + 1)]", "for i in range(steps)]",
        _EAP_TORCH_TESTS),
}

# The operators kept model slips one makes: + for -, * for /, < for <=,
# == for !=, a sign or a `not` dropped or added, True for False, and for
# or, a loop that never runs, a constant off by one. Replacing + by ** or
# << only produces crashes here, and costs a test run each.
KEEP_OPERATORS = (
    r"core/(ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|"
    r"FloorDiv_Div|BitAnd_BitOr|BitOr_BitAnd)"
    r"|ReplaceComparisonOperator_(Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Lt_Gt|Gt_Lt|"
    r"LtE_GtE|GtE_LtE|Eq_NotEq|NotEq_Eq)"
    r"|ReplaceUnaryOperator_(USub_UAdd|Delete_USub|Delete_Invert|Delete_Not)"
    r"|ReplaceTrueWithFalse|ReplaceFalseWithTrue|ReplaceAndWithOr"
    r"|ReplaceOrWithAnd|AddNot|ZeroIterationForLoop|ReplaceBreakWithContinue"
    r"|ReplaceContinueWithBreak|NumberReplacer)$")
# In the array code most numbers are axes and ranks: a changed axis dies on
# a shape error, so NumberReplacer runs only where numbers are values.
NO_NUMBERS = r"core/NumberReplacer$"


def copy_tree(dest: pathlib.Path) -> None:
  """The working tree's files (tracked and untracked, not ignored)."""
  if dest.exists():
    shutil.rmtree(dest)
  files = subprocess.run(
      ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
      cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
  for name in filter(None, files):
    if (ROOT / name).is_file():  # (a deleted file is still listed)
      (dest / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(ROOT / name, dest / name)


def line_ranges(path: pathlib.Path, functions, pattern) -> list[str]:
  """`start-end` line specs of the named functions, plus matching lines."""
  tree = ast.parse(path.read_text())
  found = {node.name: f"{node.lineno}-{node.end_lineno}"
           for node in ast.walk(tree)
           if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
  missing = [f for f in functions if f not in found]
  if missing:
    raise SystemExit(f"{path}: no function {missing}")
  specs = [found[f] for f in functions]
  if pattern:
    specs += [str(i) for i, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(pattern, line) and not line.lstrip().startswith("#")]
  return specs


def toml_list(items) -> str:
  return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def run(cmd, cwd, **kw):
  return subprocess.run(cmd, cwd=cwd, check=True, **kw)


def mutate(name: str, workdir: pathlib.Path, timeout: float) -> dict:
  module, functions, pattern, tests, numbers = TARGETS[name]
  exclude = [f"(?!{KEEP_OPERATORS})"] + ([] if numbers else [NO_NUMBERS])
  test_command = f"{PYTEST} {tests}"
  # The unmutated tests must pass, or every mutant would count as killed.
  print(f"[{name}] baseline: {test_command}", flush=True)
  run(test_command, workdir, shell=True, stdout=subprocess.DEVNULL)
  config = workdir / f"{name}.toml"
  config.write_text(f"""[cosmic-ray]
module-path = "{module}"
timeout = {timeout}
excluded-modules = []
test-command = "{test_command.replace('"', "'")}"

[cosmic-ray.distributor]
name = "local"

[cosmic-ray.filters.operators-filter]
exclude-operators = {toml_list(exclude)}

[cosmic-ray.filters.line-filter]
lines = {{ "{module}" = {toml_list(line_ranges(workdir / module, functions,
                                                 pattern))} }}
""")
  session = workdir / f"{name}.sqlite"
  session.unlink(missing_ok=True)
  quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  run([BIN / "cosmic-ray", "init", config, session], workdir, **quiet)
  run([BIN / "cr-filter-operators", session, config], workdir, **quiet)
  run([BIN / "cr-filter-lines", "--config", config, session], workdir,
      **quiet)
  run([BIN / "cosmic-ray", "exec", config, session], workdir, **quiet)
  return summarize(session)


def summarize(session: pathlib.Path) -> dict:
  # Imported here: the planted bugs (`--planted`) run without cosmic-ray.
  from cosmic_ray.work_db import use_db  # pylint: disable=g-import-not-at-top
  from cosmic_ray.work_db import WorkDB  # pylint: disable=g-import-not-at-top
  from cosmic_ray.work_item import TestOutcome  # pylint: disable=g-import-not-at-top
  from cosmic_ray.work_item import WorkerOutcome  # pylint: disable=g-import-not-at-top
  counts = dict(generated=0, killed=0, survived=0, timeout=0, incompetent=0,
                filtered=0)
  survivors = []
  with use_db(str(session), WorkDB.Mode.open) as db:
    for item, result in db.completed_work_items:
      if result.worker_outcome == WorkerOutcome.SKIPPED:
        counts["filtered"] += 1
        continue
      counts["generated"] += 1
      if result.test_outcome == TestOutcome.SURVIVED:
        counts["survived"] += 1
        m = item.mutations[0]
        survivors.append(f"{m.module_path}:{m.start_pos[0]} "
                         f"{m.operator_name}\n{result.diff}")
      elif result.test_outcome == TestOutcome.INCOMPETENT:
        counts["incompetent"] += 1
      elif result.output == "timeout":
        counts["timeout"] += 1
      else:
        counts["killed"] += 1
    # Mutants never run (a run stopped early) are left pending.
    counts["not_run"] = (db.num_work_items - counts["filtered"]
                         - counts["generated"])
  counts["generated"] += counts["not_run"]
  counts["survivors"] = survivors
  return counts


def planted(workdir: pathlib.Path, timeout: float) -> list[str]:
  """Plant each bug of `PLANTED` in turn in the copy at `workdir` and run
  its tests; returns a table row per bug (killed: the tests failed)."""
  rows = ["| planted bug | tests | outcome (the first test failed) |",
          "|---|---|---|"]
  for name, (module, old, new, tests) in PLANTED.items():
    path = workdir / module
    clean = path.read_text()
    if clean.count(old) != 1:
      raise SystemExit(f"{name}: {module} must contain {old!r} once, found "
                       f"{clean.count(old)}")
    path.write_text(clean.replace(old, new))
    try:
      done = subprocess.run(f"{PYTEST} -rf {tests}", cwd=workdir,
                            shell=True, capture_output=True, text=True,
                            timeout=timeout)
      failed = re.findall(r"^FAILED (\S+)", done.stdout, re.M)
      outcome = (f"killed by {failed[0]}" if failed else "killed") \
          if done.returncode else "SURVIVED"
    except subprocess.TimeoutExpired:
      outcome = "timeout"
    finally:
      path.write_text(clean)
    rows.append(f"| {name} | {tests} | {outcome} |")
    print(rows[-1], flush=True)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--only", default=",".join(TARGETS),
                      help="comma-separated targets: " + ", ".join(TARGETS))
  parser.add_argument("--workdir", default=str(ROOT / "build" / "mutation"))
  parser.add_argument("--timeout", type=float, default=300.0,
                      help="seconds per mutant's test run")
  parser.add_argument("--planted", action="store_true",
                      help="run the hand-planted bugs (PLANTED) only")
  args = parser.parse_args()
  if args.planted:
    workdir = pathlib.Path(args.workdir).resolve()
    copy_tree(workdir)
    report = "\n".join(planted(workdir, args.timeout)) + "\n"
    (workdir / "planted.md").write_text(report)
    print(report)
    if "SURVIVED" in report:
      raise SystemExit(1)
    return
  names = args.only.split(",")
  unknown = [n for n in names if n not in TARGETS]
  if unknown:
    raise SystemExit(f"unknown targets {unknown}; expected {list(TARGETS)}")
  workdir = pathlib.Path(args.workdir).resolve()
  copy_tree(workdir)
  lines = ["| target | generated | killed | survived | timeout | "
           "incompetent | not run |", "|---|---|---|---|---|---|---|"]
  details = []
  for name in names:
    c = mutate(name, workdir, args.timeout)
    lines.append(f"| {name} | {c['generated']} | {c['killed']} | "
                 f"{c['survived']} | {c['timeout']} | {c['incompetent']} | "
                 f"{c['not_run']} |")
    details += [f"## {name}: survivor {i + 1}\n\n```diff\n{s}\n```\n"
                for i, s in enumerate(c["survivors"])]
    print(lines[-1], flush=True)
  report = "\n".join(lines) + "\n\n" + "\n".join(details)
  (workdir / "summary.md").write_text(report)
  print(report)


if __name__ == "__main__":
  main()
