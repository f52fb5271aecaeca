"""asentmax.nn.KVCache: the keys/values it returns equal the concatenation of every appended step (awkward
step sizes, with and without a capacity, across growths), steps write in place between growths, growth is
geometric (few buffers, bounded spare room), generate() reserves enough room never to grow, and a bad
capacity is refused in one line."""

import pytest
import torch

from asentmax.nn import KVCache, ModelConfig, Transformer
from asentmax.nn.cache import ROOM_MULTIPLE

STEPS = [7, 1, 1, 3, 1, 64, 1, 1, 130, 1, 2]


def random_steps(steps, layers=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [[(torch.randn(2, 3, t, 5, generator=gen, dtype=torch.float64),
              torch.randn(2, 3, t, 5, generator=gen, dtype=torch.float64)) for _ in range(layers)]
            for t in steps]


@pytest.mark.parametrize("capacity", [None, 1, 8, 1000], ids=lambda c: f"capacity{c}")
def test_update_equals_concatenation(capacity):
    cache = KVCache(capacity=capacity)
    appended = [[[], []] for _ in range(2)]
    for count, step in enumerate(random_steps(STEPS)):
        for layer, (k, v) in enumerate(step):
            keys, values = cache.update(layer, k, v)
            appended[layer][0].append(k)
            appended[layer][1].append(v)
            assert torch.equal(keys, torch.cat(appended[layer][0], dim=2))
            assert torch.equal(values, torch.cat(appended[layer][1], dim=2))
            assert keys is cache.keys[layer] and values is cache.values[layer]
        assert cache.length == sum(STEPS[:count + 1])


def test_steps_write_in_place_and_growth_is_geometric():
    """One token at a time to 3,000 slots: the filled slots stay a view of one buffer between growths (a step
    copies nothing old), the buffers are few (growth by an eighth) and never more than an eighth and one
    ROOM_MULTIPLE larger than the slots they hold; the filled slots are never contiguous (one layout)."""
    cache = KVCache()
    k = torch.zeros(1, 2, 1, 4)
    storages, slots_copied = [], 0
    for step in range(3000):
        keys, _ = cache.update(0, k + step, k - step)
        storage = keys.untyped_storage().data_ptr()
        if not storages or storage != storages[-1]:
            storages.append(storage)
            slots_copied += step  # a new buffer received the step slots filled before this one
        room = cache._buffers[0][0].shape[2]
        assert room % ROOM_MULTIPLE == 0 and step + 1 < room <= (step + 1) * 9 // 8 + ROOM_MULTIPLE + 1
        assert not keys.is_contiguous()
    assert torch.equal(cache.keys[0][0, 0, :, 0], torch.arange(3000.0))
    assert len(storages) <= 30, len(storages)
    assert slots_copied <= 9 * 3000, slots_copied  # concatenating copied 3000 * 2999 / 2 = 4.5M slots


def test_generate_reserves_room_for_every_token(monkeypatch):
    def refuse(*args):
        raise AssertionError("generate()'s cache grew a buffer")

    monkeypatch.setattr(KVCache, "_grown", staticmethod(refuse))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                    attention="asentmax", position="nape")).double().eval()
    ids = torch.randint(0, 11, (2, 63))
    out = model.generate(ids, 70)
    full = model(out)[:, 62:-1].argmax(-1)  # greedy tokens are the argmax of the uncached forward
    assert torch.equal(full, out[:, 63:])


@pytest.mark.parametrize("capacity", [0, -2, 2.5, "8", True])
def test_bad_capacity_is_refused(capacity):
    with pytest.raises(ValueError, match="capacity must be None or an int >= 1"):
        KVCache(capacity=capacity)
