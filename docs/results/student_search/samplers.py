"""The prior, random search and TPE at 25% over three seeds (each seed its own calibration sample
and sampler seed; 24 trials each): the first trial within 1% of the seed's best (over its three
studies), and the best after 8, 16 and 24 (run from docs/results/student_search/)."""

import optuna

URL = "sqlite:///studies.db"  # run from this folder
optuna.logging.set_verbosity(optuna.logging.WARNING)


def study(sampler: str, seed: int) -> str:
    return "smollm2-latent25" if (sampler, seed) == ("prior", 0) else \
        f"smollm2-latent25-{sampler}-s{seed}"


for seed in (0, 1, 2):
    runs = {}
    for sampler in ("prior", "tpe", "random"):
        trials = sorted(optuna.load_study(study_name=study(sampler, seed), storage=URL).trials,
                        key=lambda t: t.number)
        ran = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
        best, curve = float("inf"), []
        for t in ran:
            if t.state.name == "COMPLETE":
                best = min(best, t.values[0])
            curve.append(best)
        runs[sampler] = curve
    target = 1.01 * min(c[-1] for c in runs.values())
    for sampler, curve in runs.items():
        first = next((i for i, v in enumerate(curve, 1) if v <= target), None)
        print(f"seed {seed} {sampler:6s}: within 1% at trial {first or 'none in 24'}; best after "
              f"8 {curve[7]:.4f}, 16 {curve[15]:.4f}, {len(curve)} {curve[-1]:.4f} "
              f"(plan {curve[0]:.4f})")
