"""The multi-turn CPU preset's reward: right answer 1.0, the tool's (wrong) result 0.5, anything else 0.0."""
from reward.tool_use_reward import compute_score


def trajectory(expression_result: str, answer: str) -> str:
    # what verl decodes for a calculator trajectory (special tokens skipped, the tool tags are plain added tokens)
    return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4"}}\n</tool_call>\nuser\n'
            f"<tool_response>\n{expression_result}\n</tool_response>\nassistant\nThe answer is {answer}. #### {answer}")


def score(text: str, gold: str = "12") -> float:
    return compute_score(data_source="recipe/tiny_calculator", solution_str=text, ground_truth=gold, extra_info={})


def test_the_right_answer_scores_one_with_or_without_the_tool():
    assert score(trajectory("12", "12")) == 1.0
    assert score(trajectory("15", "12")) == 1.0
    assert score("The answer is 12. #### 12") == 1.0


def test_a_wrong_answer_that_uses_the_tools_result_scores_half():
    assert score(trajectory("15", "15")) == 0.5
    assert score(trajectory("7/2", "3.5")) == 0.5  # the same number, written differently


def test_a_wrong_answer_that_ignores_the_tool_or_has_no_answer_scores_zero():
    assert score(trajectory("15", "16")) == 0.0
    assert score(trajectory("15", "")) == 0.0
    assert score("The answer is 15. #### 15") == 0.0  # no tool reply to be consistent with
    assert score("") == 0.0 and score(None) == 0.0
