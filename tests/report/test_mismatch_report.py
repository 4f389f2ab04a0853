"""The A/B report on router replay: two runs (R3 on, off) logged through verl's file logger with the mismatch
metrics (verl's ``rollout_corr/k3_kl``, the recipe's out-of-band share); their table rows, their plot, and the
config diff, which counts the two router-replay keys as the arms' own switch."""
import numpy as np
import pytest

from recipe.report import compare, load_run, plot_mismatch, render_config_diff, render_markdown

K3 = {"r3": {1: 2e-4, 2: 3e-4, 3: 4e-4}, "noreplay": {1: 2e-3, 2: 8e-3, 3: 2e-2}}
BAND = {"r3": {1: 0.001, 2: 0.002, 3: 0.003}, "noreplay": {1: 0.01, 2: 0.03, 3: 0.08}}
MODE = {"r3": ("R3", True), "noreplay": ("disabled", False)}


@pytest.fixture
def arms(tmp_path, inputs):
    for name in K3:
        run = tmp_path / name
        records = [(s, {"training/global_step": s, "timing_s/step": 10.0, "rollout_corr/k3_kl": K3[name][s],
                        "rollout/mismatch/ratio_out_of_band": BAND[name][s]}) for s in K3[name]]
        inputs.write_verl_log(run / "logs" / "metrics.jsonl", records)
        config = inputs.launch_config(name, "20250101T000000Z", recipe=True)
        mode, rollout = MODE[name]
        config["actor_rollout_ref"]["actor"]["megatron"]["router_replay"] = {"mode": mode}
        config["actor_rollout_ref"]["rollout"]["enable_rollout_routing_replay"] = rollout
        inputs.write_launch_config(run, "20250101T000000Z", config)
    return load_run(tmp_path / "noreplay"), load_run(tmp_path / "r3")


def test_table_compares_the_mismatch(arms):
    off, r3 = arms
    rows = {r.label: r for r in compare(off, r3)}
    k3 = rows["train-inference k3 KL mean (rollout_corr/k3_kl)"]
    assert k3.a == pytest.approx(np.mean(list(K3["noreplay"].values())))
    assert k3.b == pytest.approx(3e-4) and k3.ratio == pytest.approx(3e-4 / 0.01)
    assert rows["train-inference k3 KL max over steps"].a == pytest.approx(2e-2)
    band = rows["tokens with train/rollout ratio outside [1/2, 2], mean share"]
    assert (band.a, band.b) == (pytest.approx(0.04), pytest.approx(0.002))
    assert "| train-inference k3 KL mean (rollout_corr/k3_kl) | 0.01 | 0.0003 | 0.030 |" in \
        render_markdown(compare(off, r3), (off.name, r3.name))


def test_a_run_without_the_metrics_shows_n_a(arms, runs_dir):
    off, _ = arms
    rows = {r.label: r for r in compare(load_run(runs_dir / "baseline"), off)}
    band = rows["tokens with train/rollout ratio outside [1/2, 2], mean share"]
    assert band.a is None and band.b == pytest.approx(0.04) and band.ratio is None


def test_plot_draws_both_metrics_per_run(arms):
    off, r3 = arms
    k3_ax, band_ax = plot_mismatch([off, r3]).axes
    assert [line.get_label() for line in k3_ax.lines] == ["noreplay", "r3"]
    assert k3_ax.lines[1].get_xydata().tolist() == [[s, v] for s, v in K3["r3"].items()]
    assert k3_ax.get_yscale() == "log"
    assert band_ax.lines[0].get_ydata().tolist() == list(BAND["noreplay"].values())


def test_router_replay_keys_are_the_arms_switch(arms):
    off, r3 = arms
    text = render_config_diff(off.config, r3.config, (off.name, r3.name))
    assert '- actor_rollout_ref.actor.megatron.router_replay.mode: "disabled" -> "R3"' in text
    assert "- actor_rollout_ref.rollout.enable_rollout_routing_replay: false -> true" in text
    assert "WARNING: actor_rollout_ref" not in text
