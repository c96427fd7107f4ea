"""``--use-torch-fsdp2`` on every backend; the sharding machinery is ``adaptor/fsdp2/``."""
