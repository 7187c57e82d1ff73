"""Framework-free pieces shared by every backend: config, data, results, the training loop."""
