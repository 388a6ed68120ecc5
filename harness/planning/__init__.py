"""The arithmetic behind picking the tool and predicting past this machine: memory per GPU of each
way to split a training run (memory.py, `distlab plan`) and the alpha-beta step model (step_model.py,
`distlab predict`). Imports nothing of the harness's stages."""
