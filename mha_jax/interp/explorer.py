"""See the heads: one self-contained HTML page to explore a model's attention.

Shape letters: L layers, B examples, H heads, Tq query length, Tk key
length, T length of a sequence, F input features.

`explore(model, batch, ...)` measures a model on a batch and returns the
page's data: every head's attention pattern on one example of the batch
(`held_out.weights_of`: the weights the analyses and results.json use),
readable labels for the tokens on both sides, and per head, over the whole
batch, the scores of `head_metrics.head_metrics`, the loss increase when the
head alone is ablated (`interventions.zero_ablation`) and the floors the
scores are read against: uniform attention over the keys each query may
see, and the same architecture at initialisation (as `interp/survey.py`
reports them). `render(data)` turns that into one HTML page that opens
from disk and makes no network request; `write_explorer` does both.

The work is split by concern, and every name stays importable from here:
`explorer_batch` builds the batch (a user's text as token ids, targets
and labels), `explorer_measure` computes the numbers (`explore`) and
`explorer_page` encodes them as JSON and renders the page (`render`).

Given an SAE's features (`sae_features=`, the dicts `mha_jax/sae/view.py`
documents, and `sae_layer=`, the layer whose z it reads), the page also
has a features panel: the feature list, the chosen feature's top contexts
shaded by activation, its decoder share by head, and for a chosen context
the DFA of its top token by source token and by head; a head's bar
selects that head in the grid. Given `sae_head_features=` (each head's
top features by decoder share, `mha_jax.sae.attribution.
head_top_features`), the selected head of that layer lists the features
it writes most, each a button that opens the feature in the panel; every
listed feature must be one of `sae_features`, so each one opens.

An encoder-decoder has three kinds of attention, each its own view:
encoder self-attention (source x source), decoder self-attention (target
x target) and cross-attention (target queries x source keys).

Why a hand-written page: what a reader needs are linked views (a layer x
head grid that selects the heatmap, a query token that highlights its keys
in the text for every head, a table row that selects its head, the value
under the pointer). Treescope's `render_array` draws one array with sliders
inside its own shadow DOM, which the page cannot drive, and shows token
labels only in its hover text. It does serve, below the linked views, as
the raw-array panel: every weight of the view as one `[L, H, Tq, Tk]` array
with sliders over layer and head, zoom and hover.
"""

from __future__ import annotations

import pathlib

from mha_jax.interp.explorer_batch import SPECIAL_NAMES
from mha_jax.interp.explorer_batch import decoder_text_batch
from mha_jax.interp.explorer_batch import encoder_decoder_text_batch
from mha_jax.interp.explorer_batch import greedy_target
from mha_jax.interp.explorer_batch import parse_tokens
from mha_jax.interp.explorer_batch import text_batch
from mha_jax.interp.explorer_batch import token_labels
from mha_jax.interp.explorer_measure import DECODER_KINDS
from mha_jax.interp.explorer_measure import ENCODER_DECODER_KINDS
from mha_jax.interp.explorer_measure import ENCODER_KINDS
from mha_jax.interp.explorer_measure import Kind
from mha_jax.interp.explorer_measure import POSITION_SCORES
from mha_jax.interp.explorer_measure import explore
from mha_jax.interp.explorer_measure import floor_scores
from mha_jax.interp.explorer_measure import kinds_of
from mha_jax.interp.explorer_measure import uniform_weights
from mha_jax.interp.explorer_measure import visible_keys
from mha_jax.interp.explorer_page import SCORE_COLUMNS
from mha_jax.interp.explorer_page import b64_float32
from mha_jax.interp.explorer_page import gqa_note
from mha_jax.interp.explorer_page import page_html
from mha_jax.interp.explorer_page import page_json
from mha_jax.interp.explorer_page import render
from mha_jax.interp.explorer_sae import sae_panel

__all__ = [
    "DECODER_KINDS", "ENCODER_DECODER_KINDS", "ENCODER_KINDS", "Kind",
    "POSITION_SCORES", "SCORE_COLUMNS", "SPECIAL_NAMES", "b64_float32",
    "decoder_text_batch", "encoder_decoder_text_batch", "explore",
    "floor_scores", "gqa_note", "greedy_target", "kinds_of", "page_html",
    "page_json", "parse_tokens", "render", "sae_panel", "text_batch",
    "token_labels",
    "uniform_weights", "visible_keys", "write_explorer",
]


def write_explorer(model, batch, path, *, loss: str | None = None,
                   init_model=None, example: int = 0, title: str = "",
                   info=(), circuits=None, labels: dict | None = None,
                   specials: bool = True, raw_arrays: bool = True,
                   sae_features=None, sae_layer: int | None = None,
                   sae_head_features=None) -> pathlib.Path:
  """Measure `model` on `batch` (`explore`) and write the page to `path`.

  For an experiment's report: `write_explorer(model, batch,
  workdir / "explorer.html", loss=task.loss, init_model=...)` with the
  batch its analysis used. `sae_features` and `sae_layer` add the SAE
  features panel, `sae_head_features` the features each head writes most
  (see `explore`). Returns the path written.
  """
  data = explore(model, batch, loss=loss, init_model=init_model,
                 example=example, labels=labels, specials=specials,
                 sae_features=sae_features, sae_layer=sae_layer,
                 sae_head_features=sae_head_features)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(render(data, title=title or "Attention explorer",
                         info=info, circuits=circuits,
                         raw_arrays=raw_arrays))
  return path
