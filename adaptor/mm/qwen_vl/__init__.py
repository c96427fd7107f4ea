"""Qwen2.5-VL and Qwen3-VL on megatron-core.

Vision side:

- :mod:`.image_processor`: images to ``(pixel_values, grid_thw)`` the way the published processors make them.
- :mod:`.video_processor`: a video's frames to ``(pixel_values_videos, grid_thw)``, frames grouped in time.
- :mod:`.settings`: the towers' hyper-parameters, read from a Hugging Face ``vision_config``.
- :mod:`.vision_grid`: what ``grid_thw`` alone decides (patch coordinates, 2-D rotary angles, window order,
  attention segments, the learned position table resampled to each image).
- :mod:`.layers`: megatron-core layer spec and config of the vision blocks, the patch merger.
- :mod:`.vision`: :class:`Qwen25VisionTower` and :class:`Qwen3VisionTower`.
- :mod:`.weights`: Hugging Face ``visual.*`` names to the towers' parameters and back, whole or per TP rank.

Text side:

- :mod:`.rope_index`: the 3-D rotary positions of text, image and video tokens.
- :mod:`.rotary`: multimodal rotary embeddings, sectioned and interleaved.
- :mod:`.text_config`: the text decoder's shape from a VL config.json.
- :mod:`.decoder`: the text decoder as a ``GPTModel``.
- :mod:`.deepstack`: Qwen3-VL's visual features added after early decoder layers.
- :mod:`.forward`: token ids and vision embeddings in, logits out.
- :mod:`.text_weights`: the decoder's weights from a Hugging Face checkpoint.

Data side:

- :mod:`.data_config`: MindSpeed-MM's ``huggingface`` data.json, checked key by key.
- :mod:`.records`: LLaMA-Factory's sharegpt records with images and videos, checked before training.
- :mod:`.video_frames`: a record's video (frame list, frame directory, or file through PyAV) as frames.
- :mod:`.chat_format`: Qwen's chat format as text pieces in or out of the loss.
- :mod:`.samples`: one record to token ids, loss, positions and patches.
- :mod:`.dataset`: the training dataset, its micro-batch collate and its loader.

The whole model in pretrain_mm.py:

- :mod:`.model_json`: model.json of ``qwen2_5vl`` / ``qwen3vl`` (MindSpeed-MM's keys, ``init_from_hf_path``).
- :mod:`.model`: :class:`~.model.QwenVLModel`, tower and decoder for Megatron's loop (TP, PP, freezing).
- :mod:`.checkpoint`: the whole model's tensors from a Hugging Face directory per TP/PP rank, and back.
- :mod:`.steps`: the batch's TP broadcast, the forward step, initial weights (``init_from_hf_path`` or
  ``--hf-load-dir``), the dataset call.
"""
