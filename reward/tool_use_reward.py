"""The multi-turn CPU preset's reward (``MULTI_TURN=1 PRESET=cpu``): the answer, with partial credit for using the tool.

1.0 when the final ``#### answer`` is right (``reward/math_reward.py``); 0.5 when it is wrong but is what the last
tool call returned (the model wrote the wrong expression, then used the tool's result as it should); 0.0 otherwise.
The trained tiny model (``recipe.tiny.sft``) calls the calculator on about two thirds of the prompts and
otherwise answers at once with a guess (worth 0); after a call it answers right ~30% of the time at temperature 1 (it
often copies a wrong number into its expression) and with the tool's result ~60% of the time. So a call is worth ~0.45
on average and a guess nothing: GRPO's first lesson is to call the tool, and the partial credit also rewards using
its answer. verl's custom reward signature (verl's actors import ``reward`` from the checkout,
on the PYTHONPATH the launch gives them).
"""
import re

from reward.math_reward import compute_score as math_score
from reward.math_reward import extract_answer, is_equiv

_TOOL_REPLY = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.S)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    if math_score(data_source, solution_str, ground_truth, extra_info) == 1.0:
        return 1.0
    replies = _TOOL_REPLY.findall(solution_str or "")
    answer = extract_answer(solution_str or "")
    if replies and answer is not None and is_equiv(answer, replies[-1]):
        return 0.5
    return 0.0
