"""The training loop (:mod:`.trainer`) and the data adapters feeding it (:mod:`.data_adapters`)."""
