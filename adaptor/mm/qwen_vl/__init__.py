"""The Qwen2.5-VL and Qwen3-VL vision side: image processor, vision towers, Hugging Face weight names.

- :mod:`.image_processor`: images to ``(pixel_values, grid_thw)`` the way the published processors make them.
- :mod:`.settings`: the towers' hyper-parameters, read from a Hugging Face ``vision_config``.
- :mod:`.positions`: what ``grid_thw`` alone decides (patch coordinates, 2-D rotary angles, window order,
  attention segments, the learned position table resampled to each image).
- :mod:`.layers`: megatron-core layer spec and config of the vision blocks, the patch merger.
- :mod:`.vision`: :class:`Qwen25VisionTower` and :class:`Qwen3VisionTower`.
- :mod:`.weights`: Hugging Face ``visual.*`` names to the towers' parameters and back, whole or per TP rank.
"""
