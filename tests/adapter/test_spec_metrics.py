"""The recipe's speculative acceptance metrics from vLLM's Prometheus counters (recipe/adapter/spec_metrics.py): the
parsing of vLLM's exposition, the step difference, a live read through HTTP, and the trace's ``spec`` field."""
import http.server
import logging
import threading

import pytest

from recipe.adapter import spec_metrics as sm
from recipe.traces import LengthTraceWriter, read_records

# what vLLM 0.28's PrometheusStatLogger exposes for two engines (data parallel), other metrics around it
EXPOSITION = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny model"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="tiny model"} 6.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny model"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny model"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="tiny model"} 24.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny model"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="tiny model"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny model",position="0"} 9.0
vllm:generation_tokens_total{engine="0",model_name="tiny model"} 500.0
"""


def test_parse_sums_engines_and_ignores_other_series():
    assert sm.parse_counters(EXPOSITION) == {"drafts": 16.0, "draft_tokens": 64.0, "accepted_tokens": 16.0,
                                             "generation_tokens": 500.0}
    assert sm.parse_counters("vllm:generation_tokens_total 3.0\n") == {"generation_tokens": 3.0}
    assert sm.parse_counters("vllm:spec_decode_num_drafts_total 3.0\n") == {"drafts": 3.0}  # no labels


def test_step_metrics_are_the_difference():
    before = {"a:1": {"drafts": 10.0, "draft_tokens": 40.0, "accepted_tokens": 10.0, "generation_tokens": 100.0}}
    after = {"a:1": {"drafts": 30.0, "draft_tokens": 120.0, "accepted_tokens": 30.0, "generation_tokens": 200.0}}
    m = sm.step_metrics(before, after)
    # 100 tokens in 80 steps: 20 drafted (2 tokens each), 60 not (a tail-only schedule, or no match)
    assert m == {"rollout/spec_drafts": 20.0, "rollout/spec_draft_tokens": 80.0, "rollout/spec_accepted_tokens": 20.0,
                 "rollout/spec_generation_tokens": 100.0, "rollout/spec_draft_acceptance_rate": 0.25,
                 "rollout/spec_acceptance_length": 2.0, "rollout/spec_tokens_per_step": 1.25}
    assert sm.step_metrics(None, after) == {} and sm.step_metrics(after, None) == {}
    idle = sm.step_metrics(after, after)
    assert idle["rollout/spec_draft_acceptance_rate"] == 0.0 and idle["rollout/spec_acceptance_length"] == 1.0
    assert idle["rollout/spec_tokens_per_step"] == 1.0
    assert sm.trace_fields(m) == {"drafts": 20, "draft_tokens": 80, "accepted_tokens": 20, "acceptance_length": 2.0,
                                  "tokens_per_step": 1.25}
    assert sm.trace_fields({}) is None


COUNTS = {"drafts": 100.0, "draft_tokens": 400.0, "accepted_tokens": 100.0, "generation_tokens": 1000.0}


def test_a_replica_whose_counters_went_down_leaves_the_step_without_metrics(caplog):
    """A replica that restarted between the readings began counting again: what it did in between is unknown, so
    the step gets no acceptance metrics (and a warning naming it), even where the sum over the replicas still grew
    (replica b's growth hides a's reset in the totals) or only one counter went down."""
    before = {"a:1": COUNTS, "b:2": COUNTS}
    restarted = {"a:1": {"drafts": 2.0, "draft_tokens": 8.0, "accepted_tokens": 1.0, "generation_tokens": 9.0},
                 "b:2": {"drafts": 300.0, "draft_tokens": 1200.0, "accepted_tokens": 300.0,
                         "generation_tokens": 3000.0}}
    with caplog.at_level(logging.WARNING, logger=sm.__name__):
        assert sm.step_metrics(before, restarted) == {}
    assert "http://a:1/metrics went down" in caplog.text and "b:2" not in caplog.text
    one_down = {"a:1": dict(COUNTS, drafts=150.0, draft_tokens=600.0, accepted_tokens=99.0), "b:2": COUNTS}
    assert sm.step_metrics(before, one_down) == {}
    assert sm.step_metrics(before, {"b:2": COUNTS}) == {}  # a replica gone: its counts since before are unknown
    # a replica first read after the step's start started in between: all its counts are the step's
    grown = sm.step_metrics({"a:1": COUNTS}, {"a:1": COUNTS, "b:2": {"drafts": 4.0, "draft_tokens": 16.0,
                                                                       "accepted_tokens": 8.0,
                                                                       "generation_tokens": 20.0}})
    assert grown["rollout/spec_drafts"] == 4.0 and grown["rollout/spec_acceptance_length"] == 3.0


@pytest.fixture
def replicas():
    """Two fake replicas serving ``/metrics``; ``bodies[i]`` is what replica i serves."""
    bodies = [EXPOSITION, EXPOSITION]
    servers = []
    for i in range(2):
        class Handler(http.server.BaseHTTPRequestHandler):
            index = i

            def do_GET(self):  # noqa: N802
                body = bodies[self.index].encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [f"127.0.0.1:{s.server_address[1]}" for s in servers], bodies
    for s in servers:
        s.shutdown()


def test_meter_reads_every_replica_around_a_step(replicas):
    addresses, bodies = replicas
    meter = sm.SpecAcceptanceMeter(lambda: addresses)
    meter.begin()
    bodies[1] = EXPOSITION.replace('"1",model_name="tiny model"} 6.0', '"1",model_name="tiny model"} 11.0').replace(
        '"1",model_name="tiny model"} 24.0', '"1",model_name="tiny model"} 44.0').replace(
        '"1",model_name="tiny model"} 4.0', '"1",model_name="tiny model"} 14.0').replace(
        'generation_tokens_total{engine="0",model_name="tiny model"} 500.0',
        'generation_tokens_total{engine="0",model_name="tiny model"} 530.0')
    m = meter.end()
    assert m["rollout/spec_drafts"] == 5 and m["rollout/spec_draft_tokens"] == 20
    assert m["rollout/spec_accepted_tokens"] == 10 and m["rollout/spec_acceptance_length"] == 3.0
    assert m["rollout/spec_generation_tokens"] == 30 and m["rollout/spec_tokens_per_step"] == 1.5  # 30 in 20 steps
    bodies[0] = "vllm:generation_tokens_total 1.0\n"  # stats off: no counters, no metrics (a warning)
    meter.begin()
    assert meter.end() == {}
    assert sm.scrape(["127.0.0.1:1"], timeout_s=1) is None  # nothing listening


def test_a_replica_exposing_part_of_the_counters_is_not_read(replicas, caplog):
    """Drafts without accepted tokens (or any other part of the counters) would make a step's acceptance up from one
    replica's counters and not the other's: the reading fails, with a warning naming what is missing."""
    addresses, bodies = replicas
    assert set(sm.scrape(addresses)) == set(addresses)
    bodies[1] = "".join(line + "\n" for line in EXPOSITION.splitlines() if "accepted_tokens_total" not in line)
    with caplog.at_level(logging.WARNING, logger=sm.__name__):
        assert sm.scrape(addresses) is None
    assert f"http://{addresses[1]}/metrics has no vllm:spec_decode_num_accepted_tokens_total " in caplog.text
    assert "num_drafts" not in caplog.text
    meter = sm.SpecAcceptanceMeter(lambda: addresses)
    meter.begin()
    bodies[1] = EXPOSITION
    assert meter.end() == {}


def test_trace_record_keeps_the_step_totals(tmp_path):
    w = LengthTraceWriter(tmp_path / "t.jsonl")
    w.append(epoch=0, step=1, cap=None, response_length=8, gen_time_s=1.0, rows=[0], sample_index=[0], lengths=[3],
             spec={"drafts": 2, "draft_tokens": 8, "accepted_tokens": 1, "acceptance_length": 1.5})
    w.append(epoch=0, step=2, cap=None, response_length=8, gen_time_s=1.0, rows=[0], sample_index=[0], lengths=[3])
    w.close()
    recs = read_records(tmp_path / "t.jsonl")
    assert recs[1]["spec"]["accepted_tokens"] == 1 and "spec" not in recs[2]


def test_around_adds_the_validations_acceptance(replicas):
    addresses, bodies = replicas
    meter = sm.SpecAcceptanceMeter(lambda: addresses)

    def validate():
        bodies[0] = EXPOSITION.replace('"0",model_name="tiny model"} 12.0', '"0",model_name="tiny model"} 20.0')
        return {"val-core/acc": 0.5}

    out = meter.around(validate)
    assert out["val-core/acc"] == 0.5 and out["val-aux/spec_accepted_tokens"] == 8
    assert out["val-aux/spec_drafts"] == 0 and "rollout/spec_drafts" not in out
