"""Long sequences without Transformer Engine: context parallelism and packed documents.

Both features put the adaptor's core attention (``adaptor.ops.flash_attention.FlashAttention``)
in the layer spec where megatron-core's local ``DotProductAttention`` cannot do the job."""
