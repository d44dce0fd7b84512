"""How validation drives each family's model: a planned case as Polygraphy feeds, the model's
runners as one Polygraphy runner, that runner's outputs back into answers, and their comparison.

Both families plan a case into runner trees (``plan.trees``) and turn hidden states at the
readouts into head outputs (``model.read``) and a response (``model.finish``); the vision family
adds the case's image to the feeds and its vision tower to the runner, and is compared unrounded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from .compare_answers import compare, compare_omnijev
from .tree_runner import TreeRunner, encode, split_hidden


def _trees(plan: Any) -> list[Any]:
    return [tree for tree, _ in plan.trees]


class TextCases:
    """Vela 2.0: the trees' token ids in, hidden states out; answers compared as served."""

    compare = staticmethod(compare)

    def feeds(self, plan: Any) -> OrderedDict[str, np.ndarray]:
        return encode(_trees(plan))

    def runner(self, model: Any, name: str | None = None) -> TreeRunner:
        return TreeRunner(model.runner, name)

    def answers(self, model: Any, plan: Any, outputs: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The response as served and the answers compared, from one case's runner outputs."""
        response = model.finish(plan, self.result(model, plan, outputs))
        return response, response

    @staticmethod
    def result(model: Any, plan: Any, outputs: dict[str, np.ndarray]) -> Any:
        return model.read([plan], split_hidden(outputs["hidden"], _trees(plan)))[0]


class VisionCases(TextCases):
    """OmniJev: the image goes in with the tree, the runner runs the vision tower before the backbone.

    Answers are compared unrounded: the served four decimals would hide the float32 gate's 1e-5,
    and omnijev.md §12 bounds no rounded comparison (its fixtures hold finishing alone to one unit
    of the 4th decimal, §12.1), so the model is asked for its values before rounding.
    """

    compare = staticmethod(compare_omnijev)

    def feeds(self, plan: Any) -> OrderedDict[str, np.ndarray]:
        return encode(_trees(plan), [(plan.pixels.values, plan.pixels.grid)])

    def runner(self, model: Any, name: str | None = None) -> TreeRunner:
        return TreeRunner(model.runner, name, vision=model.image_features)

    def answers(self, model: Any, plan: Any, outputs: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, Any]]:
        result = self.result(model, plan, outputs)
        return model.finish(plan, result), model.finish(plan, result, digits=None)
