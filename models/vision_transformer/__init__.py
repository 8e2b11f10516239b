"""vision_transformer: the Model Zoo's ViT image classifier (``model.name: vision_transformer``), its
ImageNet1K data and its Hugging Face adapters (ViTForImageClassification, CLIPVisionModelWithProjection)."""

from cs_run.registry import register_model

register_model("vision_transformer", "cs_run.models.vision_transformer.model:build_model",
               data_processors=("ImageNet1KProcessor",),
               hf_converter="cs_run.models.vision_transformer.hf", hf_model_types=("vit", "clip_vision_model"),
               config_class="cs_run.models.vision_transformer.config:VisionTransformerConfig",
               builder="cs_run.models.vision_transformer.model:build")
