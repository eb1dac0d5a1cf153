"""negft: fine-tune open_clip models for negation and composition, probe them every epoch, patch, release."""
__version__ = "0.1.0"
