"""How ``study_v1.db`` was made (run once; the file is committed and must keep opening).

    python tests/data/make_frozen_study.py tests/data/study_v1.db
"""

from __future__ import annotations

import sys

import optuna
from optuna.trial import TrialState

from arch import ArchConfig, HeadGroup, LayerSpec
from studies import add_record, open_storage, set_study_attrs


def main(path: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=open_storage(f"sqlite:///{path}"), study_name="frozen",
                                direction="minimize")
    set_study_attrs(study, task="ngram", metric="mse", space_name="heads_vs_dim")
    for n, (heads, value, steps, state) in enumerate([
            (1, 0.50, 100, TrialState.COMPLETE), (2, 0.30, 100, TrialState.COMPLETE),
            (4, 0.20, 100, TrialState.COMPLETE), (8, 0.05, 30, TrialState.PRUNED),
            (16, 0.40, 100, TrialState.COMPLETE), (32, None, 10, TrialState.FAIL)]):
        layer = LayerSpec("mhsa", (HeadGroup(heads, 64 // heads),))
        arch = ArchConfig(d_model=64, layers=(layer, layer), max_seq_len=16, input_dim=8)
        add_record(study, arch, value, state=state, predicted_error=float(10 - n),
                   steps_reached=steps, status="completed", curve={10: 1.0, 30: 0.5})


if __name__ == "__main__":
    main(sys.argv[1])
