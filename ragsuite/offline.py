"""ragsuite reaches only the hosts its user names: the LM and retrieval servers given on the command line or
to the library, and the sources ``ragsuite data download`` fetches from.

DSPy (its model-metadata map, on the first LM reply it prices) and LiteLLM (its model-cost map, when it is
imported) each download a price map from GitHub unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is true, and both
ship a snapshot of it. Offline, the download costs a wait of up to 5 s and a warning on every run; online,
it is a request to a host the user never named. ragsuite has them use their snapshots.

Example:
    >>> use_bundled_model_metadata()    # before DSPy or LiteLLM first reads the variable
    >>> os.environ["LITELLM_LOCAL_MODEL_COST_MAP"]
    'True'
"""

from __future__ import annotations

import os

#: The variable DSPy and LiteLLM read to choose their bundled price map over a download.
LOCAL_COST_MAP_ENV = "LITELLM_LOCAL_MODEL_COST_MAP"
#: Where they download it from: a user who set it named that host.
COST_MAP_URL_ENV = "LITELLM_MODEL_COST_MAP_URL"


def use_bundled_model_metadata() -> None:
    """Have DSPy and LiteLLM price replies from the maps they ship, unless the user set
    ``LITELLM_LOCAL_MODEL_COST_MAP`` (``False`` downloads the latest prices, as those libraries do by
    default) or named the map's host with ``LITELLM_MODEL_COST_MAP_URL``.

    Called by the command line before anything imports DSPy, and by :func:`ragsuite.lm.build_lm` for library
    use; it takes effect where it runs before DSPy prices its first reply and before LiteLLM is imported.
    """
    if not os.environ.get(LOCAL_COST_MAP_ENV) and not os.environ.get(COST_MAP_URL_ENV):
        os.environ[LOCAL_COST_MAP_ENV] = "True"


__all__ = ["COST_MAP_URL_ENV", "LOCAL_COST_MAP_ENV", "use_bundled_model_metadata"]
