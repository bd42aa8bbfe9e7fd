r"""One config trained on one device and on a simulated 2x4 mesh.

  python -m experiments.mesh_check --workdir=runs/mesh_check
  python -m experiments.mesh_check --config.experiment.steps=300

The model, task and optimizer of configs/copy.py; `experiment` holds what
the check itself chooses: how many steps each run trains and the mesh of
the second run (data x model axes; model must divide the head count).
`:smoke`: the copy smoke model for 4 steps on the same 2x4 mesh.
"""

import ml_collections

from configs import copy
from configs import default


def get_config(arg=None) -> ml_collections.ConfigDict:
  smoke = default.is_smoke(arg, "configs/mesh_check.py")
  c = copy.get_config()
  c.experiment = e = ml_collections.ConfigDict()
  e.steps = 150  # training steps of each run
  e.data = 2  # data axis of the mesh run
  e.model = 4  # model (head) axis of the mesh run
  if smoke:
    copy.shrink(c)
    e.steps = 4
  return c
