"""Training (Keras 3's ``keras/src/trainers``), one room per job; imports run down this list only.

* :mod:`.trainer`: the ``Trainer`` class (a mixin of ``Model``): ``compile``, the steps, Keras 3's
  step API (``train_step``/``test_step``/``predict_step``, ``compute_loss``/``compute_metrics``),
  ``fit``/``evaluate``/``predict`` (delegating to :mod:`.loops`) and ``*_on_batch``;
* :mod:`.loops`: the epoch loops of ``fit``/``evaluate``/``predict`` and the callbacks they drive;
* :mod:`.feeds`: user data checked against the model, in step form (the feeds of the loops, the
  batches of ``*_on_batch``);
* :mod:`.data_adapters`: arrays, generators and PyDatasets as batches on the model's device, and
  ``EpochIterator`` (Keras 3's ``steps_per_epoch`` rules);
* :mod:`.compile_utils`: ``compile``'s arguments resolved per output, the compile config;
* :mod:`.precision`: mixed precision inside the steps (loss scale, compute-dtype weight copies);
* :mod:`.step_graphs`: the steps captured as CUDA graphs and replayed;
* :mod:`.protocol`: what the trainer needs from a model, and the step graphs from the trainer.
"""
