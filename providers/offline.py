"""Import litellm offline.

Without these two variables, ``import litellm`` fetches the model cost map from the
network, and a llama model name stalls about 23 s looking for a tokenizer. They are
set at start-up unless the user has set them already.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from types import ModuleType

__all__ = ["configure_offline", "import_litellm"]


def configure_offline() -> None:
    """Set litellm's offline switches unless the user set them."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")


@lru_cache(maxsize=1)
def import_litellm() -> ModuleType:
    """``import litellm`` with the offline switches set, once per process."""
    configure_offline()
    try:
        import litellm
    except ImportError as exc:  # pragma: no cover - litellm is a core dependency
        raise ImportError("litellm is missing: pip install loomrt") from exc
    litellm.telemetry = False
    litellm.suppress_debug_info = True
    if not os.environ.get("LITELLM_LOG"):  # loomrt records what matters; litellm's chatter is noise
        logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    return litellm
