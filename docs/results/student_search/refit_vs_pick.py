"""The refit trial against the original studies' picks, paired by window on the same new windows
(run from docs/results/student_search/: python refit_vs_pick.py)."""

from pathlib import Path

from common.stats import paired_bootstrap
from userdata import DataSpec
from workers.search import ConfirmRequest, confirm

S = Path.home() / ".cache/transformer-alloc/smollm2"
URL = "sqlite:///studies.db"  # run from this folder
for budget, original, pick in (("0.25", "smollm2-latent25", 15), ("0.125", "smollm2-latent12", 21)):
    for source in ("code", "licenses"):
        spec = DataSpec(str(S / "tokens" / source))
        refit = next(r for r in confirm(ConfirmRequest(
            URL, f"smollm2-refit-{budget}", spec, top=0, quiet=True)).rows if r.label == "refit")
        chosen = next(r for r in confirm(ConfirmRequest(
            URL, original, spec, top=0, trials=(pick,), quiet=True)).rows if r.number == pick)
        diff, low, high = paired_bootstrap(refit.losses, chosen.losses)
        print(f"{budget} {source}: refit {refit.loss:.4f}, pick {chosen.loss:.4f}, refit - pick "
              f"{diff:+.4f} [{low:+.4f}, {high:+.4f}]; refit vs plan {refit.vs_plan}")
