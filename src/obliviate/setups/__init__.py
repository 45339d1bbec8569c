"""What studies run on, shared by the demos and the sweeps: the synthetic world and its two models (`world`), and a
pretrained model's known facts probed and grouped (`knowledge`)."""
