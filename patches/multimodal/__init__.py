"""``pretrain_mm.py``: MindSpeed-MM's model.json/data.json and vision towers without TE."""
