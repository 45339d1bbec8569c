"""The demos: `synthetic` (a synthetic world, tiny target and retain models trained here, then each method; fully
offline, minutes on a CPU) and `knowledge` (a real pretrained model forgets facts it knows)."""
