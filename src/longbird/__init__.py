"""longbird: turn a short pretrained encoder into a long-context encoder without pretraining from scratch."""

from .config import PRESETS, LongBirdConfig
from .heads import (
    LongBirdForMaskedLM,
    LongBirdForQuestionAnswering,
    LongBirdForSequenceClassification,
    register_auto_classes,
)
from .modeling import LongBirdModel
from .convert import SUPPORTED_FAMILIES, convert

__version__ = "0.1.0"
METHODS = {
    "kobigbird": "BigBird ITC block-sparse attention + TAPER absolute positions (KoBigBird-large)",
    "littlebird": "BiALiBi + unpack & sliding-window attention + pack attention; Padding Insertion (LittleBird)",
}

register_auto_classes()

__all__ = [
    "METHODS", "PRESETS", "SUPPORTED_FAMILIES", "LongBirdConfig", "LongBirdForMaskedLM", "LongBirdForQuestionAnswering",
    "LongBirdForSequenceClassification", "LongBirdModel", "convert",
]
