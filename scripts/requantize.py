"""Re-quantizes the Q4_1 tensors of a GGUF file to another block type, offline.

Why: candle 0.10.2 (the version mistral.rs 0.8.1 pins) has AVX2 dot products for Q8_0 and
Q4_0 but none for Q4_1, so every Q4_1 matmul runs a scalar loop. Re-quantizing those
tensors lets the engine use its SIMD kernels. Everything else is kept as it is: every
metadata key (with `general.file_type` updated), the tokenizer, the chat template, and
every tensor that is not Q4_1 (norms stay F32, the Q8_0 embedding stays Q8_0).

Usage: python requantize.py IN.gguf OUT.gguf {Q8_0,Q4_0}
Needs the `gguf` package (numpy quantizers); scripts/fetch-model pins its version.
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.constants import Keys
from gguf.quants import dequantize, quantize

# The block type to make, and the `general.file_type` that names a file of mostly it.
TARGETS = {
    "Q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
}
SOURCE = GGMLQuantizationType.Q4_1


def copy_metadata(reader: GGUFReader, writer: GGUFWriter, file_type: int) -> None:
    for field in reader.fields.values():
        # GGUF.* are the header's own counts; the writer writes the architecture itself.
        if field.name.startswith("GGUF.") or field.name == Keys.General.ARCHITECTURE:
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
        value = file_type if field.name == Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)


def converted(tensor, target: GGMLQuantizationType) -> tuple[np.ndarray, GGMLQuantizationType]:
    """The tensor's bytes and type in the output file."""
    if tensor.tensor_type != SOURCE:
        return tensor.data, tensor.tensor_type
    weights = dequantize(tensor.data, SOURCE)
    return quantize(weights, target), target


def main(source: str, destination: str, target_name: str) -> None:
    target, file_type = TARGETS[target_name]
    reader = GGUFReader(source)
    arch = reader.get_field(Keys.General.ARCHITECTURE).contents()
    writer = GGUFWriter(destination, arch=arch, endianess=reader.endianess)
    alignment = reader.get_field(Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    copy_metadata(reader, writer, int(file_type))
    changed = 0
    for tensor in reader.tensors:
        data, kind = converted(tensor, target)
        changed += kind != tensor.tensor_type
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"requantize: {changed} of {len(reader.tensors)} tensors {SOURCE.name} -> {target_name}")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[3] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} IN.gguf OUT.gguf {{{','.join(TARGETS)}}}")
    main(*sys.argv[1:])
