"""cs-run checkpoints: ``save`` / ``load`` like torch.save / torch.load, in an HDF5 format.

See :mod:`cs_run.checkpoint.format` for the file layout, :mod:`cs_run.checkpoint.sharded` for the folder
a sharded run writes (the read verbs take either). Importing this package does not import
h5py (it is imported by the functions that read or write files).
"""

from cs_run.checkpoint.files import check_checkpoint_file as check_checkpoint_file
from cs_run.checkpoint.files import check_target as check_target
from cs_run.checkpoint.files import info as info
from cs_run.checkpoint.files import is_checkpoint_file as is_checkpoint_file
from cs_run.checkpoint.files import load as load
from cs_run.checkpoint.files import load_into as load_into
from cs_run.checkpoint.h5 import save as save
from cs_run.checkpoint.reader import NotACheckpointError as NotACheckpointError

__all__ = ["NotACheckpointError", "check_checkpoint_file", "check_target", "info", "is_checkpoint_file", "load", "load_into", "save"]
