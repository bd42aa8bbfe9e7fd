r"""Automatic circuit discovery (EAP, EAP-IG) on IOI in SmolLM2-135M.

  python -m experiments.eap_ioi --workdir=runs/eap_ioi

Writes report.md, results.json and faithfulness.png into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.eap_ioi import report
from experiments.eap_ioi import run as run_lib

_FLAGS = cli.experiment_flags(config="configs/eap_ioi.py",
                              workdir="runs/eap_ioi")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py); nothing is
  trained, so `reuse_runs` changes nothing."""
  del reuse_runs
  results = run_lib.measure(config)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
