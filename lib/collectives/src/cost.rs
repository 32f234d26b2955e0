//! The α-β cost model (Ok-Topk Table 1, DeepSpeed's 1-bit volume, EmbRace Table 2).
