"""Qwen2.5-VL and Qwen3-VL on megatron-core.

- :mod:`adaptor.mm.qwen_vl.positions`: the 3-D rotary positions of text, image and video tokens.
- :mod:`adaptor.mm.qwen_vl.rotary`: multimodal rotary embeddings, sectioned and interleaved.
- :mod:`adaptor.mm.qwen_vl.decoder`: the text decoder as a ``GPTModel``; image embeddings in, logits out.
- :mod:`adaptor.mm.qwen_vl.text_weights`: the decoder's weights from a Hugging Face checkpoint.
"""
