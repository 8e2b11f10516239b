"""dit: the Model Zoo's Diffusion Transformer (``model.name: dit``) trained on precomputed VAE latents
(DiffusionLatentImageNet1KProcessor). No Hugging Face adapter, and no sampling."""

from cs_run.registry import register_model

register_model("dit", "cs_run.models.dit.model:build_model",
               data_processors=("DiffusionLatentImageNet1KProcessor",),
               # the vendor's utils._model_to_input_map and its config validators: the data's latent shape, label
               # dropout and scaling factor are the model's (vae carries latent_size, latent_channels, scaling_factor)
               input_keys=("vae", "latent_size", "latent_channels", "label_dropout_rate", "num_classes",
                           "num_diffusion_steps"),
               config_class="cs_run.models.dit.config:DiTConfig",
               builder="cs_run.models.dit.model:build")
