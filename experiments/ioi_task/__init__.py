"""The IOI task, shared by the experiments that study it (`ioi`, and
those that read its circuit from other angles): the prompts and their
corruptions (`prompts`), the two real models and their tokenizers
(`models`), the END-only forward pass (`forward`), the heads' attention,
direct-effect and copying scores (`detectors`), the bootstrap
separation rule (`stats`), heads knocked out by their ABC means
(`knockout`), path patching (`paths`), the selection and held-out
halves (`halves`), the group rule (`groups`) and the classes the ioi
run's circuit names (`circuit`).
Imported, never run: it has no `__main__`."""
