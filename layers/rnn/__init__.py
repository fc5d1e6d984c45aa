"""The recurrent family (Keras 3's ``keras.layers`` RNN names): cells, ``RNN(cell)``, ``SimpleRNN``/``LSTM``/``GRU``
and the ``Bidirectional`` / ``TimeDistributed`` wrappers, all in ``keras.ops`` (see :mod:`.rnn`)."""

from .cells import DropoutRNNCell, GRUCell, LSTMCell, SimpleRNNCell, StackedRNNCells
from .rnn import GRU, LSTM, RNN, SimpleRNN
from .wrappers import Bidirectional, TimeDistributed

__all__ = ["DropoutRNNCell", "SimpleRNNCell", "LSTMCell", "GRUCell", "StackedRNNCells", "RNN", "SimpleRNN", "LSTM",
           "GRU", "Bidirectional", "TimeDistributed"]
