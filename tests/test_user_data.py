"""A user's own data, reward and logger on the CPU path: a parquet with its own column names (PROMPT_KEY,
ANSWER_KEY) through the recipe's dataset on verl's RLHFDataset, a reward function of the user's through verl's own
custom reward loader, and LOGGER, each through the preflight as ``scripts/train_grpo.sh`` runs it."""
import datasets
import pandas as pd
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from recipe.adapter.dataset import LengthAwareRLHFDataset
from recipe.loggers import has_wandb_key, logger_problems, trainer_loggers
from recipe.preflight import run_preflight
from recipe.user_data import USER_SOURCE, UserDataError, as_rl_rows

from harness.cpu_runs import CPU_RANDOM

USER_REWARD = '''
def my_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1 when the response contains the reference answer."""
    return float(str(ground_truth) in solution_str)
'''


def user_parquet(path, n, long_row=False):
    """A user's file: plain-text questions, numeric answers, their own column names, nothing of verl's."""
    questions = [f"What is {i} plus {i}?" for i in range(n)]
    if long_row:
        questions[-1] = "word " * 400  # far over any small MAX_PROMPT_LENGTH once templated
    pd.DataFrame({"question": questions, "solution": [2 * i for i in range(n)]}).to_parquet(path)
    return path


def test_plain_text_prompt_and_answer_become_verls_rows():
    d = datasets.Dataset.from_dict({"question": ["What is 2+2?"], "solution": [4]})
    row = as_rl_rows(d, "question", "solution")[0]
    assert row["question"] == [{"role": "user", "content": "What is 2+2?"}]
    assert row["reward_model"]["ground_truth"] == "4" and row["data_source"] == USER_SOURCE


def test_verl_rows_pass_unchanged(tiny_artifacts):
    d = datasets.Dataset.from_parquet(str(tiny_artifacts.train_parquet))
    assert as_rl_rows(d, "prompt", None) is d


@pytest.mark.parametrize("prompt_key, answer_key, message", [
    ("prompt", "solution", "PROMPT_KEY=prompt: the data has no such column (columns: question, solution)"),
    ("question", "answer", "ANSWER_KEY=answer: the data has no such column"),
    ("question", None, "no 'reward_model' column (columns: question, solution): export ANSWER_KEY="),
])
def test_wrong_column_names_are_named(prompt_key, answer_key, message):
    d = datasets.Dataset.from_dict({"question": ["q"], "solution": [1]})
    with pytest.raises(UserDataError) as e:
        as_rl_rows(d, prompt_key, answer_key)
    assert message in str(e.value)


def test_dataset_applies_the_chat_template_to_a_users_file(verl_config, tiny_artifacts, tmp_path):
    """verl's length filter counts the chat-templated prompt (its ``apply_chat_template`` on the messages), so the
    over-long row goes and the rest arrive as verl's rollout reads them (``raw_prompt``, ``reward_model``)."""
    tok = AutoTokenizer.from_pretrained(tiny_artifacts.model_dir)
    path = user_parquet(tmp_path / "mine.parquet", 17, long_row=True)
    data = OmegaConf.to_container(verl_config, resolve=True)["data"]
    cfg = OmegaConf.create({**data, "train_files": str(path), "prompt_key": "question", "answer_key": "solution",
                            "max_prompt_length": 64, "train_batch_size": 8, "gen_batch_size": 8})
    ds = LengthAwareRLHFDataset(data_files=str(path), tokenizer=tok, config=cfg)
    assert len(ds) == 16  # 17 rows, the long one filtered, a whole number of batches of 8
    item = ds[3]
    messages = [{"role": "user", "content": "What is 3 plus 3?"}]
    assert item["raw_prompt"] == messages and item["reward_model"]["ground_truth"] == "6"
    assert item["data_source"] == USER_SOURCE
    templated = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert templated.startswith("<|im_start|>user\nWhat is 3 plus 3?")


def test_users_reward_function_through_verls_custom_reward_loader(tmp_path):
    """verl's own loader (``reward.custom_reward_function``) imports the user's file and calls the function with
    the keywords its reward loop passes."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward = tmp_path / "my_reward.py"
    reward.write_text(USER_REWARD)
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(reward), "name": "my_score", "reward_kwargs": {}}}}))
    assert fn(data_source=USER_SOURCE, solution_str="it is 6", ground_truth="6", extra_info={}) == 1.0
    assert fn(data_source=USER_SOURCE, solution_str="it is 7", ground_truth="6", extra_info={}) == 0.0


@pytest.fixture
def user_env(tmp_path):
    """PRESET=cpu (its random tiny model) on the user's files, reward and logger."""
    reward = tmp_path / "my_reward.py"
    reward.write_text(USER_REWARD)
    return {**CPU_RANDOM, "CKPT_ROOT": str(tmp_path / "ckpt"), "HOME": str(tmp_path),
            "TRAIN_FILE": str(user_parquet(tmp_path / "train.parquet", 16)),
            "TEST_FILE": str(user_parquet(tmp_path / "test.parquet", 4)),
            "PROMPT_KEY": "question", "ANSWER_KEY": "solution",
            "REWARD_FUNCTION_PATH": str(reward), "REWARD_FUNCTION_NAME": "my_score", "LOGGER": "console"}


def test_preflight_composes_the_users_data_reward_and_logger(user_env):
    report = run_preflight([], user_env)
    assert report.ok, report.errors
    c = OmegaConf.to_container(report.config, resolve=True)
    assert c["data"]["prompt_key"] == "question" and c["data"]["answer_key"] == "solution"
    assert c["reward"]["custom_reward_function"] == {**c["reward"]["custom_reward_function"],
                                                     "path": user_env["REWARD_FUNCTION_PATH"], "name": "my_score"}
    assert c["trainer"]["logger"] == ["file", "console"]  # the preset's file,wandb less wandb, plus console
    assert c["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["WANDB_MODE"] == "disabled"


@pytest.mark.parametrize("change, parts", [
    ({"PROMPT_KEY": "prompt"}, ["TRAIN_FILE:", "lacks column(s) ['prompt'] (PROMPT_KEY", "export PROMPT_KEY="]),
    ({"ANSWER_KEY": "answer"}, ["TEST_FILE:", "no answer column 'answer' (ANSWER_KEY", "export ANSWER_KEY="]),
    ({"ANSWER_KEY": ""}, ["TRAIN_FILE:", "no 'reward_model' column", "export ANSWER_KEY="]),
    ({"LOGGER": "tensorboard"}, ["LOGGER='tensorboard' must be one of 'wandb', 'wandb-offline', 'console', 'off'"]),
    ({"REWARD_FUNCTION_NAME": "two_args"}, ["REWARD_FUNCTION_NAME=two_args", "does not take verl's keyword",
                                            "data_source, solution_str, extra_info", "def two_args(data_source"]),
])
def test_each_mistake_is_named_with_its_fix(user_env, change, parts):
    with open(user_env["REWARD_FUNCTION_PATH"], "a") as f:
        f.write("\ndef two_args(response, ground_truth):\n    return 0.0\n")
    errors = run_preflight([], {**user_env, **change}).errors
    assert any(all(p in e for p in parts) for e in errors), errors


@pytest.mark.parametrize("logger, trainer_logger, expected", [
    ("wandb", "console,file,wandb", ["console", "file", "wandb"]),
    ("wandb-offline", "file", ["file", "wandb"]),
    ("console", "console,file,wandb", ["console", "file"]),
    ("off", "console,file,wandb,tensorboard", ["file", "tensorboard"]),
])
def test_logger_sets_wandb_and_console_and_keeps_the_metrics_file(logger, trainer_logger, expected):
    assert trainer_loggers({"LOGGER": logger, "TRAINER_LOGGER": trainer_logger}) == expected


def test_default_logger_is_online_with_a_key_else_offline(user_env):
    env = {k: v for k, v in user_env.items() if k != "LOGGER"}
    for extra, mode, loggers in (({}, "offline", ["file", "wandb"]), ({"WANDB_API_KEY": "k"}, "online",
                                                                      ["file", "wandb"])):
        report = run_preflight([], {**env, **extra})
        assert report.values["LOGGER"] == ("wandb" if extra else "wandb-offline")
        assert report.values["WANDB_MODE"] == mode
        assert report.config.trainer.logger == loggers


def test_online_wandb_without_a_key_is_refused(tmp_path):
    home = {"HOME": str(tmp_path)}
    (problem,) = logger_problems(home, {"LOGGER": "wandb"})
    assert problem.startswith("LOGGER=wandb") and "export WANDB_API_KEY=" in problem and "LOGGER=off" in problem
    assert logger_problems({**home, "WANDB_API_KEY": "k"}, {"LOGGER": "wandb"}) == []
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    assert has_wandb_key(home) and logger_problems(home, {"LOGGER": "wandb"}) == []
    (contradiction,) = logger_problems({**home, "LOGGER": "off", "WANDB_MODE": "online"}, {"LOGGER": "off"})
    assert "WANDB_MODE=online contradicts LOGGER=off" in contradiction
