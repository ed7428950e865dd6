"""`fullres plan` knows attention: the ring's collective-permutes are its own column, not halo, and each
device's block of attention scores is reported beside them."""

import jax

from tests.trainer.zoo import test_ring_attention
from trainer.plan import compiled_step, layout_measure, layout_search, plan_row, plan_text, ring_traffic

NETWORK = "tests/trainer/zoo/test_ring_attention.py:flat_tokens"  # 32 tokens, 2 heads of 4, float32

_RING = ('%collective-permute.3 = f32[1,16,2,4]{3,2,1,0} collective-permute(f32[1,16,2,4]{3,2,1,0} %k), '
         'source_target_pairs={{0,1},{1,0}}, metadata={op_name="jit(train_step)/jvp(global_attention)/shard_map/'
         'ppermute"}')
_HALO = ('%collective-permute.1 = f32[1,1,16,8,4]{4,3,2,1,0} collective-permute(f32[1,1,16,8,4]{4,3,2,1,0} %x), '
         'source_target_pairs={{0,1}}, metadata={op_name="jit(train_step)/jvp(conv3d)/conv_general_dilated"}')


def test_ring_permutes_are_counted_apart_from_halo_exchanges():
    assert ring_traffic.permute_bytes("\n".join([_RING, _HALO, _RING])) == (2048, 2 * 512)
    assert ring_traffic.permute_bytes(_HALO) == (2048, 0)


def test_a_split_attention_networks_plan_reports_ring_traffic_and_scores_apart_from_halo(monkeypatch):
    config = compiled_step.plan_config(NETWORK)
    builder = compiled_step.StepBuilder(config, compiled_step.example_shape(config, test_ring_attention.SIZE))
    compiled = []  # the step the row reads, kept to count all its permutes here (compiled once)
    original = layout_measure.xla_compile.compile

    def keep(lowered):
        compiled.append(original(lowered))
        return compiled[-1]

    monkeypatch.setattr(layout_measure.xla_compile, "compile", keep)
    row = layout_measure.measure(builder, (1, 2, 1, 1, 1), jax.devices()[:2], device_memory=None)
    every_permute = sum(ring_traffic.permute_bytes(compiled[0][0].as_text()))
    # docs/layers.md: 4 · (p − 1) · B · (S/p) · heads · dim · bytes, keys and values forward, their gradients back.
    assert row.ring_bytes == 4 * 1 * 1 * 16 * 2 * 4 * 4
    assert row.halo_bytes == every_permute - row.ring_bytes and row.halo_bytes > 0  # the convolutions' own halo
    # B · heads · (T/p) · (S/p) · 4 bytes (float32 scores), against B · heads · T · S unsplit.
    assert (row.attention_score_bytes, row.unsplit_score_bytes) == (1 * 2 * 16 * 16 * 4, 1 * 2 * 32 * 32 * 4)
    assert row.exchange_bytes == row.halo_bytes + row.ring_bytes
    values = row.to_json()
    assert values["ring_bytes"] == row.ring_bytes and values["attention_score_bytes"] == 2048
    assert plan_row.PlanRow.from_json(values) == row


def test_the_table_shows_the_ring_beside_the_halo_only_where_attention_splits():
    attention = plan_row.PlanRow(2, (1, 2, 1, 1, 1), 10, 10, 20, None, 0, 3000, ring_bytes=2048,
                                 attention_score_bytes=2048)
    convolutional = plan_row.PlanRow(2, (1, 2, 1, 1, 1), 10, 10, 20, None, 0, 3000)

    def table(row):
        search = layout_search.Search(2, [row], [], 0.0)
        return plan_text.table([search], "header")

    header, line = table(attention)[1:3]
    assert "ring/step" in header and "scores" in header and line.count("2.0 KiB") == 2
    assert "ring/step" not in table(convolutional)[1]


def test_the_search_ranks_by_halo_and_ring_traffic_together():
    """Less halo but more ring traffic in all ranks second: both move between devices every step."""
    less_halo = plan_row.PlanRow(4, (1, 4, 1, 1, 1), 10, 10, 20, None, 0, 100, ring_bytes=1000)
    less_in_all = plan_row.PlanRow(4, (1, 2, 2, 1, 1), 10, 10, 20, None, 0, 500, ring_bytes=0)
    ranked = layout_search.rank_rows([less_halo, less_in_all], device_memory=100)
    assert [r.input_partition_dims for r in ranked] == [(1, 2, 2, 1, 1), (1, 4, 1, 1, 1)]
