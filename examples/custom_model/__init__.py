"""custom_model: the starter project ``cs-run init`` copies (a small CNN on synthetic shapes). Its params
file names its modules as ``model:build_model`` / ``data:build_dataloader``: the params file's folder is
on sys.path when it runs."""
