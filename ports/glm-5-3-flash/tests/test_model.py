"""The port against the transformers reference on a tiny random model, layer by layer and end to end.

Weights reach the port only through the reference's checkpoint-format state dict.
"""

import pytest
import torch

from glm5_next_hpu.reference import Glm5NextCache
from packtests.flash_reference import image_inputs, max_abs


def _capture(ref_model, **inputs):
    """(input, output) of every reference decoder layer and its self_attn / mlp."""
    seen = {}
    hooks = []
    for i, layer in enumerate(ref_model.model.language_model.layers):
        for name, mod in (("layer", layer), ("attn", layer.self_attn), ("mlp", layer.mlp)):

            def hook(m, args, kwargs, out, key=(i, name)):
                x = args[0] if args else kwargs["hidden_states"]
                seen[key] = (x, out[0] if isinstance(out, tuple) else out)

            hooks.append(mod.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        ref_model(**inputs)
    for h in hooks:
        h.remove()
    return seen


def test_every_layer_matches_reference_given_the_same_input(tiny):
    torch.manual_seed(0)
    ids = torch.randint(1, 240, (2, 90))
    seen = _capture(tiny.ref, input_ids=ids)
    mask = torch.ones(2, 90, dtype=torch.bool)
    kinds = set()
    for i, layer in enumerate(tiny.port.model.language_model.layers):
        x_attn, y_attn = seen[(i, "attn")]
        x_mlp, y_mlp = seen[(i, "mlp")]
        X, Y = seen[(i, "layer")]
        with torch.no_grad():
            assert max_abs(layer.self_attn(x_attn, mask, None), y_attn) < 1e-5 * max(1.0, float(y_attn.abs().max()))
            assert max_abs(layer.mlp(x_mlp), y_mlp) < 1e-5 * max(1.0, float(y_mlp.abs().max()))
            assert max_abs(layer(X, mask, None), Y) < 1e-5 * max(1.0, float(Y.abs().max()))
        kinds.add((type(layer.self_attn).__name__, type(layer.mlp).__name__))
    assert kinds == {
        ("KimiDeltaAttention", "MLP"),
        ("MLAAttention", "MoE"),
        ("KimiDeltaAttention", "MoE"),
        ("MLAAttention", "MLP"),
    }


def test_text_logits_match_reference_with_left_padding(tiny):
    torch.manual_seed(1)
    ids = torch.randint(1, 240, (2, 70))
    attn = torch.ones(2, 70, dtype=torch.long)
    attn[1, :13] = 0
    with torch.no_grad():
        expected = tiny.ref(ids, attention_mask=attn).logits
        got = tiny.port(ids, attention_mask=attn)
    real = attn.bool()
    assert max_abs(got[real], expected[real]) < 1e-5


def test_image_prompt_logits_match_reference(tiny):
    ids, pixels, grid = image_inputs(seed=2)
    with torch.no_grad():
        expected = tiny.ref(ids, pixel_values=pixels, image_grid_thw=grid).logits
        got = tiny.port(ids, pixel_values=pixels, image_grid_thw=grid)
    assert max_abs(got, expected) < 2e-5


def test_vision_tower_and_merger_match_reference(tiny):
    _, pixels, grid = image_inputs(seed=3, grid=(2, 4, 8))  # two frames: two attention segments
    with torch.no_grad():
        expected = tiny.ref.model.visual(pixels, grid_thw=grid).pooler_output
        got = tiny.port.model.visual(pixels, grid)
    assert got.shape == expected.shape
    assert max_abs(got, expected) < 1e-5 * max(1.0, float(expected.abs().max()))


def test_greedy_decode_of_64_tokens_is_identical_to_reference(tiny):
    torch.manual_seed(4)
    ids = torch.randint(1, 240, (1, 20))
    with torch.no_grad():
        expected = tiny.ref.generate(ids, max_new_tokens=64, do_sample=False, min_new_tokens=64, pad_token_id=0)
    got = tiny.port.greedy_generate(ids, 64)
    assert got.shape == expected.shape == (1, 84)
    assert torch.equal(got, expected)


def test_greedy_decode_with_an_image_is_identical_to_reference(tiny):
    ids, pixels, grid = image_inputs(seed=5)
    with torch.no_grad():
        expected = tiny.ref.generate(
            ids,
            pixel_values=pixels,
            image_grid_thw=grid,
            max_new_tokens=16,
            do_sample=False,
            min_new_tokens=16,
            pad_token_id=0,
        )
    got = tiny.port.greedy_generate(ids, 16, pixel_values=pixels, image_grid_thw=grid)
    assert torch.equal(got, expected)


def test_chunked_prefill_then_recurrent_decode_equals_full_prefill(tiny):
    torch.manual_seed(6)
    ids = torch.randint(1, 240, (2, 110))
    with torch.no_grad():
        full = tiny.port(ids)
        cache = Glm5NextCache()
        parts = [tiny.port(ids[:, :70], cache=cache), tiny.port(ids[:, 70:100], cache=cache)]
        parts += [tiny.port(ids[:, t : t + 1], cache=cache) for t in range(100, 110)]
    assert max_abs(torch.cat(parts, dim=1), full) < 1e-5


def test_nan_in_padded_positions_does_not_reach_real_tokens(tiny):
    torch.manual_seed(7)
    ids = torch.randint(1, 240, (2, 40))
    attn = torch.ones(2, 40, dtype=torch.bool)
    attn[0, :10] = False
    port = tiny.port
    emb = port.model.language_model.embed_tokens
    with torch.no_grad():
        clean = port(ids, attention_mask=attn)
        ids_p = ids.clone()
        ids_p[0, :10] = 255  # a token id the prompt never uses
        saved = emb.weight[255].clone()
        emb.weight[255] = float("nan")
        try:
            poisoned = port(ids_p, attention_mask=attn)
        finally:
            emb.weight[255] = saved
    assert int((~torch.isfinite(poisoned[attn])).sum()) == 0
    assert max_abs(poisoned[attn], clean[attn]) < 1e-5


@pytest.mark.slow
def test_greedy_decode_batch_with_left_padding_matches_reference(tiny):
    torch.manual_seed(8)
    ids = torch.randint(1, 240, (2, 24))
    attn = torch.ones(2, 24, dtype=torch.long)
    attn[0, :5] = 0
    with torch.no_grad():
        expected = tiny.ref.generate(
            ids, attention_mask=attn, max_new_tokens=32, do_sample=False, min_new_tokens=32, pad_token_id=0
        )
    got = tiny.port.greedy_generate(ids, 32, attention_mask=attn)
    assert torch.equal(got, expected)
