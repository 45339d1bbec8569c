"""Mutation check: one-line changes to the core math must each make the test suite fail.

Each mutant replaces one exact snippet (it must occur exactly once in its file) and runs the test
files that mirror the module (`pytest -x`, stop at the first failure). A mutant the tests do not
notice "survives"; the check passes only when every mutant is killed.

    python scripts/mutants.py            # all mutants (about 10-15 minutes on 2 cores)
    python scripts/mutants.py --list     # names only
    python scripts/mutants.py -k sago    # mutants whose name contains "sago"

Files are mutated in place and restored in a `finally`; a backup is kept beside the file
(`<file>.mutant-backup`) until it is restored, and `--restore` puts any leftover backup back.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = "src/obliviate/"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to src/obliviate/
    old: str
    new: str
    tests: tuple[str, ...]


T_LOOP = ("tests/train/test_loop_math.py",)
T_SYN = ("tests/test_gradients.py",)
T_OBJ = ("tests/objectives",)
T_LOGP = ("tests/modeling/test_logprobs.py", "tests/objectives")
T_CHUNK = ("tests/modeling/test_vocab_chunks.py",)
T_DECODE = ("tests/eval/test_decode.py",)
T_SMOOTH = ("tests/modeling/test_smoothing.py",)
T_TOFU = ("tests/eval/test_tofu.py",)
T_MEM = ("tests/eval/test_memorization.py", "tests/eval/test_mia.py")
T_CL = ("tests/eval/test_closer_look.py",)
T_SCORE = ("tests/eval/test_score.py", "tests/sweep/test_compare.py")
T_REPEATS = ("tests/sweep/test_run.py::"
             "test_a_recipe_run_first_with_its_seeds_then_a_larger_budget_repeats_the_new_best")
T_EXPORT = "tests/sweep/test_export.py::test_the_best_trial_of_an_unlearn_sweep_runs_alone_and_gives_the_trials_numbers"
T_TRANSFER = "tests/sweep/test_export.py::test_a_transfer_sweep_runs_each_selected_point_again_and_reproduces_its_numbers"
T_PAPERS = ("tests/sweep/test_compare.py::"
            "test_a_tofu_sweep_is_also_tabulated_in_the_papers_columns_over_seeds_on_the_held_out_rows")
T_PREFIX = ("tests/modeling/test_prefix.py",)
T_KNOWN = "tests/eval/test_known.py"
T_KNOWN_CLI = "tests/cli/test_finetune.py::test_the_check_runs_after_every_epoch_and_its_last_value_is_the_saved_models"
T_REUSE = "tests/cli/test_finetune.py"
T_RECIPE_CUT = "tests/sweep/test_run.py::test_a_recipe_cut_short_with_its_worker_is_run_again_not_replaced_by_a_sampled_trial"
T_PREPARE = ("tests/cli/test_prepare.py",)
T_AGG = ("tests/eval/test_aggregates.py",)
T_PAPERS_ROWS = "tests/sweep/test_compare.py::test_the_papers_columns_resample_forget_quality_and_model_utility_over_rows"

MUTANTS: list[Mutant] = [
    # the loop (train/loop.py, train/unlearn.py, modeling/frozen.py)
    Mutant("loop: rule always sum", "train/loop.py", "combine_into(plan.rule, g_f, g_r", "combine_into('sum', g_f, g_r", T_LOOP),
    Mutant("loop: alpha and gamma swapped", "train/loop.py", "alpha=plan.alpha, gamma=plan.gamma",
           "alpha=plan.gamma, gamma=plan.alpha", T_LOOP),
    Mutant("loop: fused step ignores weights", "train/loop.py", "loss = sum(w * t for w, t in terms.values())",
           "loss = sum(t for w, t in terms.values())", T_LOOP),
    Mutant("loop: forget and retain buffers not separated", "train/loop.py",
           "            _swap(params, forget_buf)\n            _, lr_", "            _, lr_", T_LOOP),
    Mutant("loop: token pooling per micro-batch, not per step", "train/unlearn.py",
           "return n * scale / (world * micro_batches)", "return n * scale / world", T_LOOP),
    Mutant("teacher: layers ignored", "modeling/frozen.py", "self.teacher.tau, self.teacher.layers)",
           "self.teacher.tau, None)", T_LOOP),
    Mutant("teacher: tau fixed at 2", "modeling/frozen.py", "self.teacher.tau, self.teacher.layers)",
           "2.0, self.teacher.layers)", T_LOOP),
    # attention smoothing
    Mutant("smoothing: scaling times tau", "modeling/smoothing.py",
           'kwargs["scaling"] = (head_dim**-0.5 if scaling is None else scaling) / tau',
           'kwargs["scaling"] = (head_dim**-0.5 if scaling is None else scaling) * tau', T_SMOOTH),
    Mutant("smoothing: default scaling not divided", "modeling/smoothing.py",
           'kwargs["scaling"] = (head_dim**-0.5 if scaling is None else scaling) / tau',
           'kwargs["scaling"] = (head_dim**-0.5 if scaling is None else scaling / tau)', T_SMOOTH),
    # reductions and KL (modeling/logprobs.py)
    Mutant("reduction: token mean divides by examples", "modeling/logprobs.py",
           "n = mask.sum().clamp_min(1).to(v.dtype) if total is None else total",
           "n = mask.shape[0] if total is None else total", T_LOGP),
    Mutant("reduction: example mean over all positions", "modeling/logprobs.py",
           "return (v.sum(-1) / mask.sum(-1).clamp_min(1).to(v.dtype)).mean()",
           "return (v.sum(-1) / mask.shape[-1]).mean()", T_LOGP),
    Mutant("kl: direction swapped", "modeling/logprobs.py", "return (p_log_probs.exp() * diff).sum(-1)",
           "return (q_log_probs.exp() * -diff).sum(-1)", T_LOGP),
    Mutant("kl: -inf terms not zeroed", "modeling/logprobs.py",
           "diff = (p_log_probs - q_log_probs).masked_fill(zero, 0.0)", "diff = p_log_probs - q_log_probs", T_LOGP),
    # forget objectives and retain terms
    Mutant("ga: sign", "objectives/forget.py", "    return policy.mean(policy.token_logp, reduction)",
           "    return -policy.mean(policy.token_logp, reduction)", T_OBJ),
    Mutant("npo: 2/beta -> 1/beta", "objectives/forget.py",
           "return -(2.0 / beta) * F.logsigmoid(-beta * (policy.logp - reference.logp.detach())).mean()",
           "return -(1.0 / beta) * F.logsigmoid(-beta * (policy.logp - reference.logp.detach())).mean()", T_OBJ),
    Mutant("npo: reference ignored", "objectives/forget.py",
           "F.logsigmoid(-beta * (policy.logp - reference.logp.detach()))", "F.logsigmoid(-beta * policy.logp)", T_OBJ),
    Mutant("simnpo: delta sign", "objectives/forget.py", "F.logsigmoid(beta * (nll - delta))",
           "F.logsigmoid(beta * (nll + delta))", T_OBJ),
    Mutant("dpo: chosen and rejected swapped", "objectives/forget.py", "F.logsigmoid(beta * (chosen - rejected))",
           "F.logsigmoid(beta * (rejected - chosen))", T_OBJ),
    Mutant("me: log V term dropped", "objectives/forget.py", "return -log_p.mean(-1) - math.log(log_p.shape[-1])",
           "return -log_p.mean(-1)", T_OBJ),
    Mutant("undial: gold logit raised", "objectives/forget.py",
           "torch.softmax(reference_log_probs.detach() - beta * onehot, dim=-1)",
           "torch.softmax(reference_log_probs.detach() + beta * onehot, dim=-1)", T_OBJ),
    Mutant("satimp: (1-p) weight dropped", "objectives/forget.py",
           "p.pow(beta1) * (1.0 - p).clamp_min(0.0).pow(beta2)", "p.pow(beta1)", T_OBJ),
    Mutant("rmu: steering coefficient ignored", "objectives/forget.py",
           "token_mse(h, steering_coef * u)", "token_mse(h, u)", T_OBJ),
    Mutant("asu: teacher and student swapped", "objectives/forget.py",
           "return masked_token_kl(teacher, policy, reduction)", "return masked_token_kl(policy, teacher, reduction)",
           T_OBJ),
    Mutant("retain kl: direction swapped", "objectives/retain.py",
           "return masked_token_kl(reference, policy, reduction)", "return masked_token_kl(policy, reference, reduction)",
           T_OBJ),
    Mutant("ap: refusal margin sign", "objectives/retain.py", "F.logsigmoid(beta * (policy.logp - refusal.logp))",
           "F.logsigmoid(beta * (refusal.logp - policy.logp))", T_OBJ),
    # gradient rules (gradients/rules.py)
    Mutant("sago: conflict mask inverted", "gradients/tensors.py", "return ((f > 0) & (r < 0)) | ((f < 0) & (r > 0))",
           "return ((f > 0) & (r > 0)) | ((f < 0) & (r < 0))", T_SYN),
    Mutant("sago: keeps g_f on conflicts", "gradients/rules.py",
           "return map_pairs(pairs, lambda i, f, r: _select(masks[i], r, f, alpha, gamma))",
           "return map_pairs(pairs, lambda i, f, r: _select(masks[i], f, r, alpha, gamma))", T_SYN),
    Mutant("pcgrad: projects when aligned", "gradients/rules.py", "return [d / (rr + EPS) if d < 0 else 0.0 for d, rr",
           "return [d / (rr + EPS) if d > 0 else 0.0 for d, rr", T_SYN),
    Mutant("pcgrad_global: normalised by g_f", "gradients/rules.py",
           "dot, rr = list_dots([(fs, rs), (rs, rs)], reduce)", "dot, rr = list_dots([(fs, rs), (fs, fs)], reduce)", T_SYN),
    Mutant("blur: projection sign", "gradients/rules.py", "gamma * f + alpha * (r - coef * f))",
           "gamma * f + alpha * (r + coef * f))", T_SYN),
    Mutant("gru: EMA weight 0.2 on the current g_r", "gradients/rules.py", "GRU_GAMMA = 0.8", "GRU_GAMMA = 0.2", T_SYN),
    Mutant("gru: retain gradient added", "gradients/rules.py", "        return gamma * f\n", "        return gamma * f + alpha * r\n",
           T_SYN),
    # metrics
    Mutant("tofu: retain truth ratio uses the forget formula", "eval/tofu.py",
           'aggregate = forget_truth_ratio if kind == "forget" else retain_truth_ratio',
           "aggregate = forget_truth_ratio", T_TOFU),
    Mutant("tofu: ROUGE against the paraphrased answer", "eval/tofu.py",
           "rouge = rouge_recall(generations, [r.answer for r in rows])",
           "rouge = rouge_recall(generations, [r.paraphrased_answer or r.answer for r in rows])", T_TOFU),
    Mutant("tofu: truth ratio inverted", "eval/tofu.py", "return np.exp(c - p.mean(axis=1))",
           "return np.exp(p.mean(axis=1) - c)", T_TOFU),
    Mutant("tofu: model utility arithmetic mean", "eval/tofu.py", "return float(hmean(nums))",
           "return float(np.mean(nums))", T_TOFU),
    Mutant("tofu: retain truth ratio without the clip", "eval/tofu.py",
           'else np.maximum(0.0, 1.0 - tr)', "else 1.0 - tr", T_TOFU),
    Mutant("tofu: per-row truth-ratio terms take the forget formula on every split", "eval/tofu.py",
           "truth_ratio_terms(self.truth_ratio, self.kind)]", 'truth_ratio_terms(self.truth_ratio, "forget")]', T_TOFU),
    Mutant("tofu: the forget replies' per-row fluency is not recorded", "eval/tofu.py",
           'rows.update({f"forget_{k}": v for k, v in per_row.items()})', "rows.update({})", T_TOFU),
    Mutant("memorization: extraction strength allows k = N", "eval/memorization.py",
           "return 1.0 - (k if empty_rest else min(k, c.size - 1)) / c.size", "return 1.0 - k / c.size", T_MEM),
    Mutant("memorization: EOS kept", "eval/mia.py", "return x[:-1] if len(x) >= 2 else x", "return x", T_MEM),
    Mutant("mia: Min-K% takes the highest log-probs", "eval/mia.py",
           "return float(-np.sort(x)[:_count(x.size, k)].mean())", "return float(-np.sort(x)[::-1][:_count(x.size, k)].mean())",
           T_MEM),
    Mutant("privleak: relative to 1 instead of AUC_retrain", "eval/memorization.py",
           "return (auc_unlearned - auc_retrain) / auc_retrain * 100.0, note",
           "return (auc_unlearned - auc_retrain) * 100.0, note", T_MEM),
    Mutant("closer look: FE without the 1 -", "eval/closer_look.py", "return (float(1.0 - nums.mean()) if used else None), used",
           "return (float(nums.mean()) if used else None), used", T_CL),
    Mutant("closer look: MU arithmetic mean", "eval/closer_look.py",
           "return (0.0 if np.any(nums == 0) else float(hmean(nums))), used",
           "return (0.0 if np.any(nums == 0) else float(np.mean(nums))), used", T_CL),
    # rule traits (gradients.py RuleSpec) and the teacher's default (modeling/teacher.py)
    Mutant("rule traits: sago fused like sum", "gradients/rules.py",
           '@rule("sago", elementwise=True, per_tensor=True, conflict_masks=True)',
           '@rule("sago", elementwise=True, per_tensor=True, conflict_masks=True, separate=False)', T_SYN),
    Mutant("rule traits: pcgrad coefficients per shard", "gradients/rules.py",
           "per_tensor=True, reduces=True, coefficients=pcgrad_coefs)", "per_tensor=True, reduces=True)",
           ("tests/train/test_fsdp.py",)),
    Mutant("teacher: default tau 3", "modeling/teacher.py", "DEFAULT_TAU = 2.0", "DEFAULT_TAU = 3.0",
           ("tests/modeling/test_teacher.py",)),
    # sharded rules and the θ0 cache
    Mutant("fsdp: pcgrad per shard, not per whole tensor", "gradients/rules.py",
           "sums = (reduce(part) if reduce is not None else part).tolist()", "sums = part.tolist()",
           ("tests/train/test_fsdp.py",)),
    Mutant("fsdp: root resharded after its forward (vocabulary chunks lose the gathered head)", "train/fsdp.py",
           "fully_shard(model, mesh=mesh, reshard_after_forward=False)",
           "fully_shard(model, mesh=mesh, reshard_after_forward=True)",
           ("tests/train/test_fsdp.py",)),
    Mutant("cache: top-k tail spread uniformly", "modeling/cache.py",
           "torch.full_like(q, float(\"-inf\")), q + shift)", "torch.full_like(q, float(\"-inf\")), shift + 0 * q)",
           ("tests/modeling/test_cache.py",)),
    # divergence guard (train/guard.py)
    Mutant("guard: non-finite gradient norm passes", "train/guard.py",
           "if grad_norm is not None and not math.isfinite(grad_norm):", "if False:", ("tests/train/test_divergence.py",)),
    Mutant("guard: exploding loss passes", "train/guard.py",
           "abs(value) > EXPLODE * max(abs(base), 1.0)", "abs(value) > EXPLODE * max(abs(base), 1.0) * 1e30",
           ("tests/train/test_divergence.py",)),
    Mutant("guard: weights not checked", "train/guard.py", "        if not math.isfinite(norm):\n",
           "        if False:\n", ("tests/train/test_divergence.py",)),
    Mutant("fluency: repetition of unique bigrams", "eval/fluency.py", "return 1.0 - len(set(bigrams)) / len(bigrams)",
           "return len(set(bigrams)) / len(bigrams)", ("tests/eval/test_fluency.py",)),
    # issue 11: packed answer rows, length grouping, precision, shared-prompt scoring
    Mutant("packed KL: direction swapped", "modeling/logprobs.py",
           "return q.spread(map_rows(kl_per_token, [p, q]))",
           "return q.spread(map_rows(kl_per_token, [q, p]))", T_LOGP),
    Mutant("vocab chunks: each chunk loses its last row", "modeling/logprobs.py",
           "args = [t[start:start + c] for t in (*inputs, *extra)]",
           "args = [t[start:start + c - 1] for t in (*inputs, *extra)]", T_CHUNK),
    Mutant("vocab chunks: a chunk's rows read the head's logits without log-softmax", "modeling/logprobs.py",
           "rows = [a if h is None else F.log_softmax(_wide(h.head(a)), dim=-1) for h, a in zip(heads, args)]",
           "rows = [a if h is None else _wide(h.head(a)) for h, a in zip(heads, args)]", T_CHUNK),
    Mutant("vocab chunks: auto chunks twice the rows", "modeling/logprobs.py",
           "CHUNK_AUTO_ELEMENTS = 2**23", "CHUNK_AUTO_ELEMENTS = 2**24", T_CHUNK),
    Mutant("θ0 hidden-state cache: an example's rows start one row late", "modeling/cache.py",
           "return (logp, rows.hidden[start: start + int(m.sum())].clone())",
           "return (logp, rows.hidden[start + 1: start + 1 + int(m.sum())].clone())", T_CHUNK),
    Mutant("cache estimate: every row counted, not the rows the plan uses", "train/unlearn.py",
           "counted = enc if rows is None else [enc[i] for i in rows]", "counted = enc", ("tests/train/test_cached.py",)),
    Mutant("group_by_length: a step loses its last example", "train/unlearn.py",
           "        out.append(order[at: at + len(m)])", "        out.append(order[at: at + len(m) - 1])",
           ("tests/train/test_switches.py",)),
    Mutant("precision: bf16 ignored", "train/loop.py", '    if getattr(cfg, "precision", "fp32") == "fp32":\n        return plan',
           "    return plan", ("tests/train/test_switches.py",)),
    Mutant("shared prompt: first answer token not counted", "eval/generate.py",
           "count = stats.mask.sum(-1).double() + first_counts.double()", "count = stats.mask.sum(-1).double()",
           ("tests/eval/test_generate.py",)),
    # issue 22, evaluation: the decode loop, automatic batches, the bit-parallel LCS
    Mutant("decode: the EOS id kept in the answer", "eval/decode.py",
           "kept[alive[stop]] = t + 1 - is_eos[stop].long()", "kept[alive[stop]] = t + 1", T_DECODE),
    Mutant("decode: KV bytes without the V half", "eval/decode.py", "return 2 * layers * kv_heads * head_dim * size",
           "return layers * kv_heads * head_dim * size", T_DECODE),
    Mutant("decode: automatic rows ignore the logits", "eval/decode.py",
           "per_row = per_token * max(tokens_per_row, 1) + 8 * max(vocab, 1)",
           "per_row = per_token * max(tokens_per_row, 1)", T_DECODE),
    Mutant("scoring: a token batch one row over its budget", "eval/generate.py",
           "if out and (len(out[-1]) + 1) * lengths[i] <= tokens:", "if out and len(out[-1]) * lengths[i] <= tokens:",
           ("tests/eval/test_generate.py",)),
    Mutant("rouge: LCS step with xor", "eval/tofu.py", "v = ((v + u) | (v - u)) & full", "v = ((v + u) ^ (v - u)) & full",
           ("tests/eval/test_eval_speed_paths.py",)),
    # issue 12: audit verdict, quantisation, receipt hashes
    Mutant("audit: recovered share against 0 instead of the 0% reference", "audit/verdict.py",
           "return (k_attacked - k_ref0) / (k_original - k_ref0)", "return k_attacked / (k_original - k_ref0)",
           ("tests/test_audit.py",)),
    Mutant("audit: int8 grid of 255 levels per side", "audit/quantize.py", "scale = x.abs().amax(dim=1, keepdim=True) / 127.0",
           "scale = x.abs().amax(dim=1, keepdim=True) / 255.0", ("tests/test_audit.py",)),
    Mutant("receipt: tensor digest without the shape line", "receipt/digests.py",
           "h = hashlib.sha256(f\"{dtype}|{','.join(str(int(s)) for s in shape)}\\n\".encode())",
           "h = hashlib.sha256(f\"{dtype}\\n\".encode())", ("tests/receipt/test_receipt.py",)),
    # issue 17: shipped data, the demo's claims, quick probes, progress in logs, leaving a torchrun launch
    Mutant("data: the short name tofu not resolved to the shipped copy", "data/rows.py",
           "return builtin_dir(str(source)) if str(source) in BUILTIN_SOURCES else source", "return source",
           ("tests/data/test_tofu_shipped.py",)),
    Mutant("demo claim: ASU_KL may keep 70% of the target's fact recall", "demos/offline.py",
           'a["forget_fact_recall"] <= 0.6 * t["forget_fact_recall"]',
           'a["forget_fact_recall"] <= 0.7 * t["forget_fact_recall"]', ("tests/demos/test_offline_demo.py",)),
    Mutant("knowledge: one fact too few per family", "eval/knowledge.py", "if count[f.family] <= n:",
           "if count[f.family] < n:", ("tests/eval/test_knowledge.py",)),
    Mutant("progress: a short phase logs too", "progress.py", "if now - self.start < self.quiet_for:",
           "if now - self.start < 0:", ("tests/test_progress.py",)),
    Mutant("end_process: the group destroyed after an error too", "train/loop.py",
           "if rc == 0 and dist.is_available() and dist.is_initialized():",
           "if dist.is_available() and dist.is_initialized():", ("tests/train/test_end_process.py",)),
    # scores over runs (eval/score.py) and the knowledge judge's forms (eval/knowledge.py)
    Mutant("forget score: MCQ not rescaled above chance", "eval/score.py",
           "parts.append(max(0.0, (float(mcq_accuracy) - chance) / (1.0 - chance)))",
           "parts.append(float(mcq_accuracy))", T_SCORE),
    Mutant("forget score: weaker probe instead of stronger", "eval/score.py", "return max(parts) if parts else None",
           "return min(parts) if parts else None", T_SCORE),
    Mutant("pareto: ties count as domination", "eval/score.py", "        if (x > y) if up else (x < y):\n            better = True",
           "        if (x >= y) if up else (x <= y):\n            better = True", T_SCORE),
    Mutant("bar: keep share ignored", "eval/score.py", "value < share * ref", "value < ref", T_SCORE),
    Mutant("bar: ceiling inclusive broken", "eval/score.py", "if math.isnan(value) or value > ceiling:",
           "if math.isnan(value) or value >= ceiling:", T_SCORE),
    Mutant("expr: NaN dropped by min/max", "eval/score.py", "    if any(math.isnan(a) for a in args):",
           "    if False:", T_SCORE),
    Mutant("judge: demonyms not derived", "eval/knowledge.py", "                out += demonyms", "                pass",
           ("tests/eval/test_knowledge.py",)),
    Mutant("judge: number words not derived", "eval/knowledge.py", "            out.append(str(NUMBER_WORDS.index(key)))",
           "            pass", ("tests/eval/test_knowledge.py",)),
    Mutant("monitor: best kept on a worse score", "train/monitor.py",
           "if self.best_score is not None and signed <= (self.best_score if self.maximize else -self.best_score):",
           "if self.best_score is not None and signed >= (self.best_score if self.maximize else -self.best_score):",
           ("tests/train/test_monitor.py",)),
    Mutant("prune: rule never relative", "sweep/run.py",
           "return self.threshold * self.metric(original) if self.relative else self.threshold",
           "return self.threshold", ("tests/sweep/test_run.py",)),
    # issue 20: the quantisation attack in shipped formats (bitsandbytes NF4 / FP4, GGUF)
    Mutant("quantize: bitsandbytes blocks of 128", "audit/quantize.py", "BNB_BLOCKSIZE = 64", "BNB_BLOCKSIZE = 128",
           ("tests/audit/test_quantize.py",)),
    Mutant("quantize: one NF4 level off", "audit/quantize.py", "0.5626170039176941,", "0.5726170039176941,",
           ("tests/audit/test_quantize.py",)),
    Mutant("quantize: gguf_q4_0 writes Q8_0", "audit/quantize.py", 'gguf_roundtrip(w, "Q4_0")',
           'gguf_roundtrip(w, "Q8_0")', ("tests/audit/test_quantize.py",)),
    # issue 20: reference details pinned (VerbMem gold, GRU's gamma, RMU's layers and window, flex smoothing, audit)
    Mutant("verbmem: gold of 128 text tokens, the BOS not counted", "eval/muse.py",
           'ids = tokenizer(text, add_special_tokens=True)["input_ids"]',
           'ids = tokenizer(text, add_special_tokens=False)["input_ids"]', ("tests/eval/test_muse.py",)),
    Mutant("gru: gru_gamma ignored (fixed 0.8)", "gradients/rules.py", "_update_ema(state, pairs, gru_gamma, first_is_g_r=False)",
           "_update_ema(state, pairs, GRU_GAMMA, first_is_g_r=False)", T_SYN),
    Mutant("preflight: RMU forget and retain layers not compared", "preflight.py",
           "    check_hidden_layers_agree(rm)  # after the range checks", "    pass  # after the range checks",
           ("tests/test_preflight.py",)),
    Mutant("smoothing: flex_attention ignores tau", "modeling/smoothing.py", "tau = getattr(module, TAU_ATTR, 1.0)",
           'tau = getattr(module, TAU_ATTR, 1.0) if backend != "flex_attention" else 1.0', T_SMOOTH),
    Mutant("rmu: default trainable window anchor-1..anchor", "train/unlearn.py",
           "range((anchor or 0) - 2, (anchor or 0) + 1)", "range((anchor or 0) - 1, (anchor or 0) + 1)",
           ("tests/train/test_unlearn.py",)),
    Mutant("audit: retain model not relearned for the 0% reference", "audit/core.py",
           'ref = relearned_copy(models["retain"], tok, rows, cfg)', 'ref = models["retain"]',
           ("tests/audit/test_relearn_reference.py",)),
    # issue 20: prompts, positions and refusals as the references
    Mutant("chat: system turn dropped", "modeling/chat.py", 'head = [{"role": "system", "content": system}] if system else []',
           "head = []", ("tests/modeling/test_chat.py",)),
    Mutant("chat: today's date, no fixed date_string", "modeling/chat.py", '        args["date_string"] = FIXED_DATE',
           "        pass", ("tests/modeling/test_chat.py",)),
    Mutant("positions: a -100 label lowers id 0, not V - 100", "modeling/positions.py", "IGNORE_INDEX % vocab_size)",
           "0)", ("tests/objectives/test_positions.py",)),
    Mutant("positions: kl's last logit of each row not counted", "modeling/positions.py", "width + (1 if last else 0)",
           "width", ("tests/objectives/test_positions.py",)),
    Mutant("positions: max_length pads to the longest row only", "modeling/positions.py",
           'max(max_length, batch["input_ids"].shape[1]) if positions == "max_length"',
           'batch["input_ids"].shape[1] if positions == "max_length"', ("tests/objectives/test_positions.py",)),
    Mutant("undial: reduction ignored", "objectives/forget.py", "return policy.mean(policy.spread(ce), reduction)",
           'return policy.mean(policy.spread(ce), "token")', ("tests/objectives/test_undial_reduction.py",)),
    Mutant("refusals: per_access draws once for the run", "data/refusals.py",
           "len(self.refusals),\n                                                                          self.seed, step)",
           "len(self.refusals),\n                                                                          self.seed, 0)",
           ("tests/data/test_refusals.py",)),
    Mutant("refusals: the loop passes no step number", "train/unlearn.py", "side.loss(model, frozen, idx, acc, pad, step, micro[3])",
           "side.loss(model, frozen, idx, acc, pad, step, 0)", ("tests/data/test_refusals.py",)),
    Mutant("gru: gru_gamma not handed to the run's rule", "train/method.py",
           "retain_loop_kw=rloop, rule_params=rule_args,", "retain_loop_kw=rloop, rule_params={},", T_LOOP),
    Mutant("objective traits: NPO's θ0 cached as whole rows", "objectives/forget.py",
           '@forget_objective("npo", needs=("reference",), frozen_use="scalar")', '@forget_objective("npo", needs=("reference",))',
           ("tests/modeling/test_cache.py",)),
    Mutant("objective traits: the cache ignores frozen_use", "modeling/cache.py",
           'kind = "scalar" if frozen_use == "scalar" else', 'kind = "scalar" if False else', ("tests/modeling/test_cache.py",)),
    Mutant("metrics: a plugin's table never returned", "eval/metrics.py",
           "for name in [*DECLARING, *(n for n in _TABLES if n not in DECLARING)]:", "for name in DECLARING:",
           ("tests/test_plugins.py",)),
    Mutant("benchmarks: the pre-flight skips the benchmark's own checks", "preflight.py",
           "    if spec.preflight:\n", "    if False:\n", ("tests/test_plugins.py",)),
    Mutant("tofu held-out: the report read from the selection's rows", "sweep/tracks.py",
           "return {**self._on(model, 0), REPORT_KEY: self._on(model, 1)}",
           "return {**self._on(model, 0), REPORT_KEY: self._on(model, 0)}", ("tests/sweep/test_run.py",)),
    Mutant("tofu held-out: forget quality against every row's retain truth ratios", "sweep/tracks.py",
           'retain_tr = None if self.retain_tr is None else self.retain_tr[index["forget"]]',
           "retain_tr = self.retain_tr", ("tests/sweep/test_run.py",)),
    Mutant("teacher: the config's opt-in for unusual tau not applied", "train/method.py",
           "teacher=Teacher.from_args(tkw, m.allow_unusual_tau)", "teacher=Teacher.from_args(tkw, False)",
           ("tests/modeling/test_teacher.py",)),
    Mutant("teacher: ASU's checks skipped by the config", "config/sections.py",
           'if "teacher" in builtin_needs("forget").get(self.forget, ()):', 'if False:',
           ("tests/modeling/test_teacher.py",)),
    Mutant("rule settings: defaults not filled in", "gradients/rules.py", "merged = {**valid, **dict(args or {})}",
           "merged = dict(args or {})", T_SYN),
    Mutant("rule settings: pcgrad's precomputed coefficients counted as a setting", "gradients/rules.py",
           'LOOP_ARGS = frozenset({"alpha", "gamma", "state", "reduce", "masks", "coefs"})',
           'LOOP_ARGS = frozenset({"alpha", "gamma", "state", "reduce", "masks"})', T_SYN),
    Mutant("fields: the column mapping not applied", "data/rows.py",
           "return {**rec, **{ours: rec[theirs] for ours, theirs in fields.items()}}", "return rec",
           ("tests/data/test_fields.py",)),
    Mutant("model card: each eval result carries the previous metric's value", "receipt/card.py",
           "metric_type=metric, metric_name=metric, metric_value=value))",
           "metric_type=metric, metric_name=metric, metric_value=out[-1].metric_value if out else value))",
           ("tests/receipt/test_card.py",)),
    Mutant("push: the receipt is not sent", "publish.py", "set(recorded) | {CARD_NAME, RECEIPT_NAME})",
           "set(recorded) | {CARD_NAME})", ("tests/cli/test_push.py",)),
    Mutant("tracking: each entry logged one step late", "train/tracking.py",
           'accelerator.log(numeric(entry), step=int(entry["step"]))',
           'accelerator.log(numeric(entry), step=int(entry["step"]) + 1)', ("tests/train/test_tracking.py",)),
    Mutant("lm-eval: few-shot count not passed", "eval/mcq.py", "limit=limit, num_fewshot=num_fewshot,",
           "limit=limit, num_fewshot=None,", ("tests/eval/test_lm_eval_options.py",)),
    Mutant("retain reference: scores read as true/false (inverted)", "eval/retain_reference.py",
           "np.array([s for _, s in sorted(rows)], dtype=np.float64)",
           "np.array([1 / s for _, s in sorted(rows)], dtype=np.float64)", ("tests/eval/test_retain_reference.py",)),
    Mutant("retain reference: a log with more rows than the forget split accepted", "eval/retain_reference.py",
           "if len(rows) != n_forget:", "if len(rows) < n_forget:", ("tests/eval/test_retain_reference.py",)),
    Mutant("saved tokenizer: TokenizersBackend class name kept", "modeling/tokenizer_files.py",
           'out["tokenizer_class"] = RENAMED_CLASSES[cls]', 'out["tokenizer_class"] = cls',
           ("tests/modeling/test_saved_tokenizer_compat.py",)),
    # issue 31: the authors' recipes (schedule, raw prompts, stream windows, the released KL, offline validation)
    Mutant("schedule: warm-up epochs rounded up", "train/schedule.py",
           "warmup = math.floor(cfg.warmup_epochs", "warmup = math.ceil(cfg.warmup_epochs", ("tests/train/test_schedule.py",)),
    Mutant("schedule: a warm-up as long as the run passes", "train/schedule.py", "if warmup and warmup >= steps:",
           "if warmup and warmup > steps:", ("tests/train/test_schedule.py",)),
    Mutant("schedule: warm-up epochs ignore accumulation", "train/schedule.py",
           "n_examples / (global_batch * cfg.grad_accum))\n    if warmup", "n_examples / global_batch)\n    if warmup",
           ("tests/train/test_schedule.py",)),
    Mutant("config: warm-up epochs may equal the run's epochs", "config/sections.py",
           "self.warmup_epochs < self.epochs", "self.warmup_epochs <= self.epochs", ("tests/train/test_schedule.py",)),
    Mutant("raw prompt: one token fewer masked", "data/tokenize.py", "return _fit(ids[:n], ids[n:], max_length)",
           "return _fit(ids[:n - 1], ids[n - 1:], max_length)", ("tests/modeling/test_chat.py",)),
    Mutant("raw prompt: no EOS after the answer", "data/tokenize.py",
           "    if eos is not None and (not ids or ids[-1] != eos):\n        ids = ids + [eos]\n    return ids, n",
           "    return ids, n", ("tests/modeling/test_chat.py",)),
    Mutant("raw prompt: a repeated {question} accepted", "modeling/chat.py", 'if fields != ["question"]:',
           'if "question" not in fields:', ("tests/modeling/test_chat.py",)),
    Mutant("stream windows: documents joined by one newline", "data/text.py", 'tokenizer([t + "\\n\\n" for t in texts]',
           'tokenizer([t + "\\n" for t in texts]', ("tests/data/test_text.py",)),
    Mutant("stream windows: the tail kept", "data/text.py",
           "range(0, len(stream) // max_length * max_length, max_length)", "range(0, len(stream), max_length)",
           ("tests/data/test_text.py",)),
    Mutant("stream windows: BOS takes a window token's place", "data/text.py",
           "document_ids(tokenizer, text)[: max_length + 1]", "document_ids(tokenizer, text)[:max_length]",
           ("tests/data/test_text.py",)),
    Mutant("stream windows: never chosen", "train/unlearn.py", 'cut = stream_windows if windows == "stream" else chunk_texts',
           "cut = chunk_texts", ("tests/data/test_text.py",)),
    Mutant("validate --offline: hub data fetched anyway", "hub.py",
           "    if skipping():\n        raise HubSkipped", "    if False:\n        raise HubSkipped",
           ("tests/cli/test_validate_presets.py",)),
    Mutant("rwku batch: retain = the first N targets", "eval/rwku.py", "names[-n_targets:]", "names[:n_targets]",
           ("tests/cli/test_prepare.py",)),
    Mutant("rwku batch: overlap allowed", "eval/rwku.py", "1 <= n_targets <= len(names) // 2",
           "1 <= n_targets <= len(names)", ("tests/cli/test_prepare.py",)),
    Mutant("teacher map: windows only from layer 0", "eval/analysis.py",
           "firsts = sorted({round(i * last / (k - 1)) for i in range(k)}) if k > 1 else [0]", "firsts = [0]",
           ("tests/eval/test_analysis.py",)),
    Mutant("teacher map: fluent forgetting ignores degeneracy", "eval/analysis.py",
           'and point["forget"]["degenerate"] <= degenerate_max)', ")", ("tests/eval/test_analysis.py",)),
    Mutant("teacher map: recall ratio against the point itself", "eval/analysis.py",
           'point["forget"]["recall"] <= recall_ratio * base["forget"]["recall"]',
           'point["forget"]["recall"] <= base["forget"]["recall"]', ("tests/eval/test_analysis.py",)),
    Mutant("intervals: ties judged against the last, not the best", "eval/intervals.py",
           "group = [k for k in left if k == left[0] or intervals[k].overlaps(lead)]",
           "group = [k for k in left if k == left[0] or intervals[k].overlaps(intervals[left[-1]])]",
           ("tests/eval/test_intervals.py",)),
    Mutant("intervals: rows never resampled", "eval/intervals.py",
           "vals.append(score({**m, **_means(r, picks, group, whole)}))",
           "vals.append(score({**m, **_means(r, None, group, whole)}))",
           ("tests/eval/test_intervals.py",)),
    Mutant("sweep: the retain model's reference row from the selection rows", "sweep/tracks.py",
           'self.retain_report = report["metrics"] if report is not None else metrics', "self.retain_report = metrics",
           ("tests/sweep/test_run.py",)),
    Mutant("intervals: rows counted over every metric, not those the score rests on", "eval/intervals.py",
           "if wanted is None or k in wanted", "if True", ("tests/eval/test_intervals.py",)),
    Mutant("score: forget_score rests on itself alone", "eval/score.py",
           'if "forget_score" in out else out', "if False else out", ("tests/eval/test_intervals.py",)),
    Mutant("intervals: the upper quantile at the level itself", "eval/intervals.py",
           "[(1 - level) / 2, (1 + level) / 2]", "[(1 - level) / 2, level]", ("tests/eval/test_intervals.py",)),
    Mutant("held out: selection reads every row", "eval/heldout.py",
           "keep = [v for v, i in zip(values, ids[name]) if (i in held_out) == report]",
           "keep = [v for v, i in zip(values, ids[name]) if report or True]", ("tests/eval/test_heldout.py",)),
    Mutant("held out: a group may be held out whole", "eval/heldout.py",
           "k = min(max(round(share * n), 1), n - 1) if n >= 2 else 0", "k = max(round(share * n), 1)",
           ("tests/eval/test_heldout.py",)),
    Mutant("compare: the verdict reads the selection's rows", "sweep/points.py",
           "    if p.report:\n        return dict(", "    if False:\n        return dict(",
           ("tests/sweep/test_run.py",)),
    Mutant("teacher map space: a point replaces the other forget args", "sweep/space.py",
           '{**(m["method"].get("forget_args") or {}), **value}', "dict(value)", ("tests/sweep/test_space.py",)),
    Mutant("teacher map space: every point, fluent or not", "sweep/space.py",
           'for g in data["grid"] if g.get("fluent_forgetting")]', 'for g in data["grid"]]',
           ("tests/sweep/test_space.py",)),
    Mutant("gguf header: the layer count from the wrong key", "modeling/gguf.py",
           'key == f"{arch}.block_count"', 'key == f"{arch}.context_length"', ("tests/modeling/test_gguf.py",)),
    Mutant("gguf header: string arrays skipped by their count, not their bytes", "modeling/gguf.py",
           '                    fh.seek(read(fh, "Q"), 1)', '                    read(fh, "Q")',
           ("tests/modeling/test_gguf.py",)),
    Mutant("plugins: registries never load them", "registry.py",
           '        """The object registered as `name`; an UnknownNameError listing valid names otherwise."""\n        load_plugins()',
           '        """The object registered as `name`; an UnknownNameError listing valid names otherwise."""',
           ("tests/test_plugins.py",)),
    Mutant("ls: the first line, not the first sentence", "cli/ls.py",
           '    words = " ".join(lines).split()', '    words = " ".join(lines[:1]).split()', ("tests/cli/test_cli.py",)),
    Mutant("reproduce: evaluations' metrics dropped", "cli/reproduce.py",
           "    for d in [run_dir, *(eval_dir(run_dir, i) for i in range(len(table.evals)))]:\n        ev.update(",
           "    for d in [run_dir]:\n        ev.update(", ("tests/cli/test_reproduce.py",)),

    # a batch's shared prefix run once (modeling/prefix.py, logprobs._stats_of), TOFU on its last N authors, the
    # two-sided MIA gap, validate's nested keys
    Mutant("prefix: labels inside the prefix ignored", "modeling/prefix.py",
           "length = min(common, first_label, T - 1)", "length = min(common, T - 1)", T_PREFIX),
    Mutant("prefix: positions restart after the prefix", "modeling/prefix.py",
           "positions = torch.arange(length, T, device=input_ids.device)",
           "positions = torch.arange(0, T - length, device=input_ids.device)", T_PREFIX),
    Mutant("prefix: sharing under gradient checkpointing", "modeling/prefix.py",
           "if getattr(inner, flag, False) or hasattr(inner, \"_orig_mod\"):", "if hasattr(inner, \"_orig_mod\"):",
           T_PREFIX),
    Mutant("prefix: the measurement accepts anything", "modeling/logprobs.py",
           "torch.allclose(shared, plain, rtol=1e-3, atol=1e-4)", "torch.allclose(shared, plain, rtol=1e3, atol=1e-4)",
           T_PREFIX),
    Mutant("prefix: label columns put after the rest", "modeling/logprobs.py",
           "stats.mask = F.pad(stats.mask, (length, 0), value=False)",
           "stats.mask = F.pad(stats.mask, (0, length), value=False)", T_PREFIX),
    Mutant("prefix: hidden states of the prefix put last", "modeling/logprobs.py",
           "torch.cat([seen[-2].expand(hidden.shape[0], -1, -1), hidden], dim=1)",
           "torch.cat([hidden, seen[-2].expand(hidden.shape[0], -1, -1)], dim=1)", T_PREFIX),
    Mutant("tofu subset: retain keeps the forget authors", "data/tofu_subset.py",
           "out[f\"retain{100 - p}\"] = mine[:-n]", "out[f\"retain{100 - p}\"] = mine[n:]", T_PREPARE),
    Mutant("tofu subset: utility's retain rows from the wrong end", "data/tofu_subset.py",
           "out[\"retain_perturbed\"] = tail[:-largest]", "out[\"retain_perturbed\"] = tail[largest:]", T_PREPARE),
    Mutant("mia: the gap one-sided", "eval/mia.py", "abs(auc - 0.5)", "(auc - 0.5)", T_MEM),
    Mutant("validate: nested keys not counted", "cli/configured.py",
           "+ _unknown_nested(data, cls)", "+ 0 * _unknown_nested(data, cls)", ("tests/cli/test_validate.py",)),
    # issue 35: the newest code's areas, each pinned by a test that fails under its mutant
    Mutant("chat: the format's template arguments not passed to the template", "modeling/chat.py",
           "add_generation_prompt=add_generation_prompt,\n                                         **args, **extra)",
           "add_generation_prompt=add_generation_prompt,\n                                         **extra)",
           ("tests/modeling/test_chat.py",)),
    Mutant("chat: a format's own date_string replaced by the fixed date", "modeling/chat.py",
           'if ("date_string" in template or "strftime_now" in template) and "date_string" not in args:',
           'if ("date_string" in template or "strftime_now" in template):', ("tests/modeling/test_chat.py",)),
    Mutant("chat: strftime_now returns the fixed date in Llama-3's form whatever its format", "modeling/chat.py",
           "{m.group(2): day.strftime(m.group(2))", "{m.group(2): day.strftime(_DATE_FORMAT)",
           ("tests/modeling/test_chat.py",)),
    Mutant("chat: a format with a system turn but no arguments not saved", "modeling/chat.py",
           'if fmt.get("prompt_template") or fmt["system"] is not None or fmt["template_args"]:',
           'if fmt.get("prompt_template") or fmt["template_args"]:', ("tests/modeling/test_chat.py",)),
    Mutant("loop positions: batch/max_length pooled over answer tokens", "train/unlearn.py",
           'kind = {"answer": "targets", "sequence": "sequence"}.get(positions)',
           'kind = {"answer": "targets", "sequence": "sequence"}.get(positions, "targets")',
           ("tests/objectives/test_positions.py", "tests/train/test_unlearn.py")),
    Mutant("loop positions: max_length not handed to the relabelling", "train/unlearn.py",
           "vocab_size=_vocab_size(model), max_length=self.max_length,",
           "vocab_size=_vocab_size(model), max_length=0,", ("tests/objectives/test_positions.py", "tests/train/test_unlearn.py")),
    Mutant("loop positions: the objective's last position not counted", "train/unlearn.py",
           "last=self.spec.last_position)", "last=False)", ("tests/objectives/test_positions.py", "tests/train/test_unlearn.py")),
    Mutant("hidden cache: every example's rows read from the first example's offset", "modeling/cache.py",
           "start = int(stats.mask[:b].sum())", "start = 0", T_CHUNK),
    Mutant("cache estimate: hidden states sized as vocabulary rows", "modeling/cache.py",
           "per, what = (width or 0) * item,", "per, what = vocab * item,", T_CHUNK),
    Mutant("cache estimate: accumulated micro-batches not counted", "train/unlearn.py",
           "                        steps * train.grad_accum)", "                        steps)",
           ("tests/train/test_cached.py",)),
    Mutant("keep_best: a sweep's trials never keep their best step", "sweep/run.py",
           "keep_best=cfg.keep_best, stop=", "keep_best=False, stop=", ("tests/sweep/test_run.py",)),
    Mutant("keep_best: a trial's best weights never restored", "sweep/tracks.py",
           "best = monitor.restore_best(student) if monitor is not None else None", "best = None",
           ("tests/sweep/test_run.py",)),
    Mutant("keep_best: restore copies nothing back", "train/monitor.py",
           "p.copy_(self._best_state[n].to(p.device))", "pass", ("tests/train/test_monitor.py",)),
    Mutant("keep_best: unlearn reports the best step without restoring it", "cli/unlearn.py",
           'metrics["best_step"] = monitor.restore_best(model)', 'metrics["best_step"] = monitor.best_step',
           ("tests/cli/test_cli.py", "tests/train/test_monitor.py")),
    Mutant("repeats: failed or pruned repeats counted among the seeds", "sweep/points.py",
           "q.repeat_of == p.name and q.state == \"complete\"]", "q.repeat_of == p.name]",
           ("tests/sweep/test_compare.py",)),
    Mutant("judge: digits not written as words", "eval/knowledge.py",
           "            out.append(NUMBER_WORDS[int(key)])", "            pass", ("tests/eval/test_knowledge.py",)),
    Mutant("quantize: gguf rows must be a multiple of 64", "audit/quantize.py",
           "GGUF_BLOCK = 32  #", "GGUF_BLOCK = 64  #", ("tests/audit/test_quantize.py",)),
    Mutant("retain reference: a rewritten log of the same size read from the memo", "eval/retain_reference.py",
           "data = _parsed(str(p.resolve()), stat.st_mtime_ns, stat.st_size)",
           "data = _parsed(str(p.resolve()), 0, stat.st_size)", ("tests/eval/test_retain_reference.py",)),
    Mutant("model card: real_authors results filed under the retain split", "receipt/card.py",
           '("real_authors_", "real_authors_split")', '("real_authors_", "retain_split")', ("tests/receipt/test_card.py",)),
    Mutant("model card: world_facts results filed under the retain split", "receipt/card.py",
           '("world_facts_", "world_facts_split")', '("world_facts_", "retain_split")', ("tests/receipt/test_card.py",)),
    Mutant("demo: every card carries the first model's metrics", "demos/offline.py",
           '{"eval": runs[name]["metrics"], "history"', '{"eval": next(iter(runs.values()))["metrics"], "history"',
           ("tests/test_readme.py::test_readme_command_runs[obliviate demo]",)),
    # one HTML page for every report; plugin benchmarks' own settings
    Mutant("page: the separator row of a table kept as a data row", "report/page.py",
           'if not set(r.replace("|", "").strip()) <= {"-", ":"}]', "]", ("tests/report/test_page.py",)),
    Mutant("page: every level-1 heading dropped, not only the title", "report/page.py",
           "            if level == 1 and skip_title:\n                skip_title = False",
           "            if level == 1:\n                skip_title = False", ("tests/report/test_page.py",)),
    Mutant("page: a figure embedded whatever its name", "report/page.py",
           "and line[line.index(\"](\") + 2:-1] in images:", "and images:", ("tests/report/test_page.py",)),
    Mutant("benchmark: a plugin's own settings read from nowhere", "eval/benchmarks.py",
           "cfg.sections.get(self.section) or {}", "{}", ("tests/test_plugins.py",)),
    Mutant("eval pre-flight: settings of no registered benchmark accepted", "preflight.py",
           "    if unknown:\n        raise ConfigError(f\"sections:", "    if False:\n        raise ConfigError(f\"sections:",
           ("tests/test_plugins.py",)),
    Mutant("layout: a sweep takes the world's models from the demo", "sweep/tracks.py",
           "from obliviate.setups.world import DemoConfig, eval_config, preflight_demo, world_models",
           "from obliviate.demos.offline import DemoConfig, eval_config, preflight_demo, world_models",
           ("tests/test_layout.py",)),
    # sweeps started at each method's recipe
    Mutant("recipe: a value outside the space accepted", "sweep/space.py",
           "inside = _number(value) and dim.low <= value <= dim.high", "inside = _number(value)",
           ("tests/sweep/test_space.py",)),
    Mutant("recipe: the base's training settings instead of the method's own", "sweep/run.py",
           "recipe_point(dims, methods[m], trains[m], m)", "recipe_point(dims, methods[m], track.train, m)",
           ("tests/sweep/test_run.py::test_a_method_may_bring_its_own_training_settings",)),
    Mutant("trial: a method's own training settings ignored", "sweep/run.py",
           "trial_settings(plan.methods[method], plan.trains[method], params,",
           "trial_settings(plan.methods[method], track.train, params,", ("tests/sweep/test_run.py::test_a_method_may_bring_its_own_training_settings",)),
    Mutant("sweep record: keys added since are not given their defaults", "sweep/run.py",
           "    return {**json.loads(json.dumps(_saved_config(SweepConfig()))), **mine}", "    return mine",
           ("tests/sweep/test_run.py::test_a_sweep_recorded_before_a_key_existed_is_still_the_same_sweep",)),
    Mutant("compare: every trial reported as a recipe", "sweep/compare.py",
           "recipes = [p for p in coll.points if p.recipe and p.state", "recipes = [p for p in coll.points if p.state",
           ("tests/sweep/test_run.py::test_each_method_starts_at_its_recipe_and_the_report_shows_it",)),
    Mutant("entry: the module teardown is not skipped", "cli/__init__.py",
           "            os._exit(rc)", "            pass", ("tests/cli/test_cli.py::test_the_console_script_keeps_exit_status_output_and_exit_functions",)),
    Mutant("entry: the run's exit functions are skipped", "cli/__init__.py",
           "            run_exit_functions()\n", "", ("tests/cli/test_cli.py::test_the_console_script_keeps_exit_status_output_and_exit_functions",)),
    Mutant("repeats: seeds from the base's train.seed, not the method's", "sweep/run.py",
           "get(\"seed\", plan.trains[method].seed))", "get(\"seed\", plan.track.train.seed))", (T_REPEATS,)),
    Mutant("repeats: a new best after a raised budget never repeated", "sweep/run.py",
           "    if plan.cfg.repeats == 0:\n        return\n    best = _best_trial(plan, study)",
           "    if plan.cfg.repeats == 0 or \"repeats_of\" in study.user_attrs:\n        return\n    best = _best_trial(plan, study)", (T_REPEATS,)),
    Mutant("repeats: a repeat queued twice runs twice", "sweep/workers.py",
           "        return any(t.number < trial.number and counts(t)", "        return False and any(t.number < trial.number",
           ("tests/sweep/test_run.py::test_a_repeat_queued_twice_runs_once",)),
    Mutant("resume: θ0 evaluated again by every worker", "sweep/run.py",
           "track.need_original = not all(", "track.need_original = True or not all(", (T_REPEATS,)),
    Mutant("compare: the recipe's interval over its first seed only", "sweep/compare.py",
           "seeds = seeds_of(coll, p)\n        iv",
           "seeds = [p]\n        iv", (T_REPEATS,)),
    Mutant("best configs: the trial's values left out", "sweep/export.py",
           "plan.trains[method], params, f", "plan.trains[method], {}, f", (T_EXPORT,)),
    Mutant("sweep set: a key given twice keeps both spellings", "sweep/config.py",
           "            object.__setattr__(self, \"set\", flat_keys(self.set))", "            pass",
           ("tests/sweep/test_run.py::test_a_set_key_given_twice_has_one_spelling_and_the_later_value",)),
    Mutant("knows: the median recall instead of the mean", "eval/known.py",
           'return {"rougeL_recall": float(np.mean(rouge_recall(', 'return {"rougeL_recall": float(np.median(rouge_recall(',
           (T_KNOWN,)),
    Mutant("knows: the bar is strict", "eval/known.py", 'return values["rougeL_recall"] >= bar and (fact is None or fact >= bar)',
           'return values["rougeL_recall"] > bar and (fact is None or fact >= bar)', (T_KNOWN,)),
    Mutant("knows: fact recall ignored", "eval/known.py", "(fact is None or fact >= bar)", "(True or fact >= bar)",
           (T_KNOWN,)),
    Mutant("knows: an epoch counts whole batches only", "eval/known.py",
           "return max(1, math.ceil(n_rows / (global_batch * grad_accum)))",
           "return max(1, n_rows // (global_batch * grad_accum))", (T_KNOWN,)),
    Mutant("knows: the last check reported as the first", "eval/known.py",
           "first = next((c for c in curve if knows(c, bar)), None)",
           "first = next((c for c in reversed(curve) if knows(c, bar)), None)", (T_KNOWN,)),
    Mutant("knows: the epoch counts steps, not passes over the rows", "cli/finetune.py",
           "    return check, n_rows / rows_per_step", "    return check, float(steps_per_epoch(n_rows, rows_per_step))",
           (T_KNOWN_CLI,)),
    Mutant("finetune reuse: another fine-tune's output reused", "cli/finetune.py", "    if diffs:\n        raise ConfigError(",
           "    if False:\n        raise ConfigError(", (T_REUSE,)),
    Mutant("finetune reuse: overwrite=true still reuses", "cli/finetune.py",
           "    if cfg.overwrite or not (out / FINGERPRINT).is_file():", "    if not (out / FINGERPRINT).is_file():",
           (T_REUSE,)),
    Mutant("transfer: the nearest miss is the method's first trial", "sweep/export.py",
           "            i = nearest_to_bar([p.metrics for p in pts], bar, coll.original)",
           "            i = 0 if pts else None", (T_TRANSFER,)),
    Mutant("transfer: the trial's training values left at the section's top level", "sweep/export.py",
           "node = out.setdefault(\"train\", {}) if key.startswith(\"train.\") else out", "node = out", (T_TRANSFER,)),
    Mutant("held-out bar: the selection's metrics instead of the held-out ones", "sweep/compare.py",
           "    seen = [judged(p) for p in seeds]\n    mets", "    seen = [(p.metrics, p.rows) for p in seeds]\n    mets",
           ("tests/sweep/test_compare.py",)),
    Mutant("held-out bar: θ0 on the selection rows as the reference", "sweep/compare.py",
           "    reference = coll.original_report or coll.original\n    seen",
           "    reference = coll.original\n    seen", ("tests/sweep/test_compare.py",)),
    Mutant("recipe table: the held-out bar over the recipe's first seed only", "sweep/compare.py",
           "again = heldout_bar(coll, bar, axes, seeds, level)", "again = heldout_bar(coll, bar, axes, [p], level)",
           ("tests/sweep/test_compare.py::test_each_recipe_meets_the_bar_again_on_the_held_out_rows_with_its_interval",)),
    Mutant("papers' columns: the selection's rows instead of the held-out ones", "sweep/compare.py",
           "values = {k: [judged(q)[0].get(k) for q in seeds]", "values = {k: [q.metrics.get(k) for q in seeds]",
           (T_PAPERS,)),
    Mutant("spread: population sd instead of the sample sd", "sweep/compare.py",
           "{_num(statistics.stdev(vals))}", "{_num(statistics.pstdev(vals))}", (T_PAPERS,)),
    Mutant("timing: the mean minutes per trial instead of the median", "sweep/compare.py",
           "\"median_s\": statistics.median(secs) if secs", "\"median_s\": statistics.mean(secs) if secs", (T_PAPERS,)),
    Mutant("knowledge: other_mcq=false still scores the other facts", "eval/knowledge.py",
           '("other", others if other_mcq else [])', '("other", others)',
           ("tests/eval/test_knowledge.py::test_the_probe_on_the_other_facts_can_be_left_out",)),
    Mutant("sweep: a recipe cut short with its worker is not queued again", "sweep/run.py",
           "            requeue_recipe(s, plan.recipes.get(name))\n", "            pass\n", (T_RECIPE_CUT,)),
    Mutant("sweep: a second copy of the recipe is not surplus", "sweep/workers.py",
           'if trial.user_attrs.get("recipe") and any(', 'if False and any(', (T_RECIPE_CUT,)),
    Mutant("sweep: a worker with other θ0 weights joins the study", "sweep/workers.py",
           "        if changed:\n            raise ObliviateError(", "        if False:\n            raise ObliviateError(",
           ("tests/sweep/test_run.py::test_a_worker_with_other_weights_for_theta0_or_other_rows_is_refused",)),
    Mutant("sweep: a TOFU study's rows digest leaves out the held-out cut", "sweep/tracks.py",
           '{"train": super().rows_record(), "cut": cut,', '{"train": super().rows_record(), "cut": None,',
           ("tests/sweep/test_run.py::test_a_tofu_tracks_rows_key_follows_its_training_rows_splits_and_cut",)),
    Mutant("sweep: a knowledge study's rows digest leaves out the probe's groups", "sweep/tracks.py",
           '"groups": {g: [f.id for f in fs] for g, fs in self.split.groups().items()},', '"groups": {},',
           ("tests/sweep/test_run.py::test_a_knowledge_tracks_rows_key_follows_the_probes_groups_and_the_held_out_facts",)),
    Mutant("audits: a share shown as a fraction, not a percentage", "sweep/audits.py",
           'f"{100 * float(value):.0f}%"', 'f"{float(value):.0f}%"',
           ("tests/sweep/test_export.py::test_compare_adds_each_best_audit_as_the_audit_wrote_it",)),
    Mutant("train.deterministic ignored", "train/loop.py", "    if cfg.deterministic:\n        make_deterministic()",
           "    if False:\n        make_deterministic()",
           ("tests/train/test_switches.py::test_deterministic_training_turns_on_torchs_deterministic_algorithms_and_cublas_workspace",)),
    Mutant("eval device: LOCAL_RANK ignored", "modeling/load.py", 'int(os.environ.get("LOCAL_RANK", "0") or 0)', "0",
           ("tests/modeling/test_load.py::test_eval_device_prefers_this_process_gpu_and_the_environment_overrides",)),
    Mutant("intervals: the whole rows as their mean", "eval/intervals.py",
           "out[k] = x if k in whole else float(x.mean())", "out[k] = float(x.mean())",
           ("tests/eval/test_intervals.py",)),
    Mutant("intervals: one draw for every group", "eval/intervals.py",
           "x = v if picks is None else v[picks[group(k, len(v))]]",
           "x = v if picks is None else v[next(iter(picks.values()))[:len(v)] % len(v)]",
           ("tests/eval/test_intervals.py",)),
    Mutant("aggregates: the forget split's closer-look truth ratio as TOFU's term", "eval/aggregates.py",
           'out[cl] = 1.0 - tr if kind == "forget" else tr', "out[cl] = tr", T_AGG),
    Mutant("aggregates: retain rows drawn with real authors'", "eval/aggregates.py",
           "for kind in sorted(KINDS, key=len, reverse=True):", "for kind in ('forget', 'retain'):", T_AGG),
    Mutant("aggregates: forget quality never recomputed", "eval/aggregates.py",
           'out["forget_quality"] = forget_quality(unlearned, retain)', "pass", T_AGG),
    Mutant("tofu: forget quality's rows are the truth-ratio terms", "eval/tofu.py",
           "rows.update(dict(zip(FQ_ROWS, ([float(v) for v in res.truth_ratio],",
           "rows.update(dict(zip(FQ_ROWS, ([float(v) for v in truth_ratio_terms(res.truth_ratio, 'forget')],",
           ("tests/eval/test_tofu.py",)),
    Mutant("compare: the papers' columns without their aggregates' parts", "sweep/compare.py",
           "which = tuple(m for m in metrics if set(PARTS.get(m, ())) & rowed)", "which = ()", (T_PAPERS_ROWS,)),
]


def _restore(path: Path) -> None:
    backup = path.with_name(path.name + ".mutant-backup")
    if backup.exists():
        backup.replace(path)


def run_mutant(m: Mutant, timeout: int) -> tuple[bool, float, str]:
    """Apply `m`, run its tests, restore; returns (killed, seconds, last line of pytest's output)."""
    path = ROOT / SRC / m.file
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"mutant {m.name!r}: the snippet occurs {text.count(m.old)} times in {m.file} (need 1); "
                         "update scripts/mutants.py to the current code")
    backup = path.with_name(path.name + ".mutant-backup")
    backup.write_text(text)
    start = time.perf_counter()
    try:
        path.write_text(text.replace(m.old, m.new))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        return proc.returncode != 0, time.perf_counter() - start, lines[-1] if lines else ""
    except subprocess.TimeoutExpired:
        return True, time.perf_counter() - start, "timed out (counted as killed)"
    finally:
        path.write_text(text)
        backup.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("-k", default="", help="only mutants whose name contains this text")
    ap.add_argument("--restore", action="store_true", help="put back files left mutated by an interrupted run")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutant")
    args = ap.parse_args(argv)
    if args.restore:
        for m in MUTANTS:
            _restore(ROOT / SRC / m.file)
        return 0
    chosen = [m for m in MUTANTS if args.k in m.name]
    if args.list:
        print("\n".join(f"{m.name}  ({m.file})" for m in chosen))
        return 0
    leftovers = sorted({m.file for m in MUTANTS if (ROOT / SRC / (m.file + ".mutant-backup")).exists()})
    if leftovers:
        raise SystemExit(f"backups of an interrupted run exist for {leftovers}: run with --restore first")
    survived = []
    for i, m in enumerate(chosen, 1):
        killed, secs, tail = run_mutant(m, args.timeout)
        print(f"[{i:2d}/{len(chosen)}] {'killed  ' if killed else 'SURVIVED'} {secs:6.1f}s  {m.name}  | {tail}", flush=True)
        if not killed:
            survived.append(m.name)
    print(f"{len(chosen) - len(survived)}/{len(chosen)} mutants killed")
    if survived:
        print("survivors: " + "; ".join(survived))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
