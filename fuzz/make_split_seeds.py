"""Seeds for the `split` fuzz target: small snapshots whose trace list is written in batches of
three (Python writes 1000; other lists whole), so that a read of a few KB splits in two parts. One with a new frame
after the split, one whose entries refer back to the frames list of an earlier entry, one of long python stacks
taken in turn out of order; each at
protocols 2 (BINPUT) and 4 (MEMOIZE, frames). Run from the repository root."""
import io
import pickle
import random

random.seed(7)


def snapshot(n, new_frame=False, refer_back=False, long_stacks=False):
    frames = [{'filename': 'train.py', 'line': 10 + i, 'name': 'f%d' % i} for i in range(3)]
    deep = [{'filename': 'model.py', 'line': 100 + i, 'name': 'g%d' % (i % 4)} for i in range(12)]
    trace, lists, addr = [], [], 0x7f0000000000
    for i in range(n):
        fl = [frames[i % 3], frames[(i + 1) % 3]]
        if long_stacks:
            # Python stacks of 10 to 17 frames, four of them taken in turn out of order.
            s = (i * 3) % 4
            fl = [deep[(s * 5 + k * 7) % 12] for k in range(10 + 2 * s)]
        if new_frame and i == n // 2:
            fl = [{'filename': 'new.py', 'line': 1, 'name': 'g'}] + fl
        if refer_back and i % 4 == 3 and lists:
            fl = lists[-1]
        lists.append(fl)
        trace.append({'action': random.choice(['alloc', 'free_requested', 'free_completed', 'segment_alloc']),
                      'addr': addr + 512 * (i % 7), 'size': 512 * (1 + i % 5), 'stream': 0,
                      'time_us': 1700000000000000 + i, 'frames': fl, 'compile_context': 'N/A',
                      'user_metadata': ''})
    block = {'address': addr, 'size': 2 << 20, 'requested_size': 0, 'state': 'inactive', 'frames': []}
    segment = {'device': 0, 'address': addr, 'total_size': 2 << 20, 'stream': 0, 'segment_type': 'small',
               'allocated_size': 0, 'active_size': 0, 'requested_size': 0, 'blocks': [block], 'frames': []}
    return {'segments': [segment], 'device_traces': [trace], 'allocator_settings': {}}


class SmallBatches(pickle._Pickler):
    """Lists in batches of three; a dict's items in one batch, as the C pickler writes an entry."""
    _BATCHSIZE = 3

    def _batch_appends(self, items):
        # Batches of three for the trace, Python's own for every other list (frames lists of
        # python stacks): set for each list, since the trace is saved inside another list.
        items = list(items)
        trace = bool(items) and isinstance(items[0], dict) and 'action' in items[0]
        saved, self._BATCHSIZE = self._BATCHSIZE, (3 if trace else 1000)
        super()._batch_appends(items)
        self._BATCHSIZE = saved

    def _batch_setitems(self, items):
        self.write(pickle.MARK)
        for k, v in items:
            self.save(k)
            self.save(v)
        self.write(pickle.SETITEMS)


cases = [('s12', snapshot(12)), ('s30', snapshot(30)), ('s30new', snapshot(30, new_frame=True)),
         ('s30ref', snapshot(30, refer_back=True)), ('s30long', snapshot(30, long_stacks=True))]
for name, s in cases:
    for protocol in (2, 4):
        out = io.BytesIO()
        SmallBatches(out, protocol=protocol).dump(s)
        with open(f'fuzz/corpus/split/{name}_p{protocol}', 'wb') as f:
            f.write(out.getvalue())
