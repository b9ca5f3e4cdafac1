"""The folder `iotune trace -- COMMAND` puts first on the command's PYTHONPATH: its
``sitecustomize`` module, imported by every Python process of the command as it starts,
tells iotune the DeepSpeed config, world size and model a training script really ran with
(iotune.train.observe reads what it writes). Nothing here is imported by iotune itself.

May import: nothing of iotune's."""
