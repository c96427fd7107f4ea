"""Qwen2.5-VL and Qwen3-VL on megatron-core.

- :mod:`adaptor.mm.qwen_vl.positions`: the 3-D rotary positions of text, image and video tokens.
- :mod:`adaptor.mm.qwen_vl.rotary`: multimodal rotary embeddings, sectioned and interleaved.
- :mod:`adaptor.mm.qwen_vl.text_config`: the text decoder's shape from a VL config.json.
- :mod:`adaptor.mm.qwen_vl.decoder`: the text decoder as a ``GPTModel``.
- :mod:`adaptor.mm.qwen_vl.deepstack`: Qwen3-VL's visual features added after early decoder layers.
- :mod:`adaptor.mm.qwen_vl.forward`: token ids and vision embeddings in, logits out.
- :mod:`adaptor.mm.qwen_vl.text_weights`: the decoder's weights from a Hugging Face checkpoint.
"""
