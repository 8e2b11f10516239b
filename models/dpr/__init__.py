"""dpr: the Model Zoo's Dense Passage Retriever (``model.name: dpr``), a question and a context encoder on bert's
encoder, trained contrastively over in-batch and hard negatives; it reads DPRHDF5DataProcessor's shards."""

from cs_run.registry import register_model

_EMBED_GEN = ("Release 2.2's DPR embedding generation, which its own run.py runs in eval mode: the selected_encoder "
              "alone over the contexts' HDF5 (written by convert_wikidpr_dataset.py) or synthetic ids, its pooled "
              "embeddings saved with their ids as embeddings-NNNN.npz (runconfig.embeddings_per_file, "
              "embeddings_output_dir); cs-run has no such predict pass, its data processor or its writer: "
              "train or evaluate dpr with DPRHDF5DataProcessor")
register_model("dpr", "cs_run.models.dpr.model:build_model", data_processors=("DPRHDF5DataProcessor",),
               hf_converter="cs_run.models.dpr.hf",
               config_class="cs_run.models.dpr.model:DPRConfig", builder="cs_run.models.dpr.model:build",
               refused_processors=(("DPREmbedGenHDF5DataProcessor", _EMBED_GEN),
                                   ("DPREmbedGenSyntheticDataProcessor", _EMBED_GEN)))
