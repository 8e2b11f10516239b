"""dino: the Model Zoo's DINOv2 self-supervised training (``model.name: dino``): a student and an EMA teacher
ViT trunk (the vision_transformer trunk, several views per sample), DinoHeads, the DINO, iBOT and KoLeo losses,
over DinoImageDataProcessor's multi-crop views of an ImageNet-layout image folder."""

from cs_run.registry import register_model

register_model("dino", "cs_run.models.dino.model:build_model", data_processors=("DinoImageDataProcessor",),
               config_class="cs_run.models.dino.config:DinoConfig", builder="cs_run.models.dino.model:build")
