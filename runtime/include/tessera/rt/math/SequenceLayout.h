//===- SequenceLayout.h - Where a rank's sequence positions lie -*- C++ -*-===//
//
// Context parallelism splits every sample's sequence over the cp group in
// Megatron's load-balanced causal layout (get_batch_on_this_cp_rank): the
// sequence is cut into 2 * cp chunks of equal length and cp rank r holds
// chunks r and 2 * cp - 1 - r, in that order, so every rank gets the same
// share of the causal attention's work. Sequence parallelism then splits the
// rank's share contiguously over tp. These functions map a rank's local row
// to its global position; the data loader, the position embedding, dropout
// and ring attention all use them, on the host and in CUDA kernels.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_MATH_SEQUENCELAYOUT_H
#define TESSERA_RT_MATH_SEQUENCELAYOUT_H

#include "tessera/rt/math/HostDevice.h"

namespace tessera::rt::math {

/// Global chunk index of local chunk `which` (0 or 1) of cp rank `cpRank`
/// out of `cpSize`.
TESSERA_HD int64_t cpChunkIndex(int64_t cpRank, int64_t cpSize, int which) {
  return which == 0 ? cpRank : 2 * cpSize - 1 - cpRank;
}

/// Global position of row `x` (0 <= x < localLength) of cp rank `cpRank`'s
/// share of a sequence; localLength = S / cpSize is even. cpSize 1 is the
/// identity.
TESSERA_HD int64_t cpGlobalPosition(int64_t x, int64_t localLength,
                                    int64_t cpRank, int64_t cpSize) {
  const int64_t chunk = localLength / 2;
  if (cpSize <= 1)
    return x;
  const int which = x < chunk ? 0 : 1;
  return cpChunkIndex(cpRank, cpSize, which) * chunk + (x - which * chunk);
}

/// A run of local rows [localBegin, localBegin + rows) whose global
/// positions are consecutive, starting at globalBegin.
struct SequencePiece {
  int64_t localBegin = 0;
  int64_t globalBegin = 0;
  int64_t rows = 0;
};

/// The (at most two) pieces of `rows` local rows that start at row
/// `shardOffset` of the cp rank's share of `cpLocalLength` rows (the
/// sequence-parallel shard's offset within it; 0 without one).
struct SequencePieces {
  SequencePiece piece[2];
  int count = 0;
};

TESSERA_HD SequencePieces sequencePieces(int64_t rows, int64_t shardOffset,
                                         int64_t cpLocalLength, int64_t cpRank,
                                         int64_t cpSize) {
  SequencePieces out;
  if (rows <= 0)
    return out;
  const int64_t chunk = cpSize <= 1 ? cpLocalLength : cpLocalLength / 2;
  int64_t local = 0;
  while (local < rows && out.count < 2) {
    const int64_t x = shardOffset + local;
    // Rows up to the end of x's chunk are consecutive.
    const int64_t chunkEnd = cpSize <= 1 ? cpLocalLength : (x / chunk + 1) * chunk;
    int64_t n = chunkEnd - x;
    if (n > rows - local || n <= 0)
      n = rows - local;
    out.piece[out.count].localBegin = local;
    out.piece[out.count].globalBegin =
        cpGlobalPosition(x, cpLocalLength, cpRank, cpSize);
    out.piece[out.count].rows = n;
    ++out.count;
    local += n;
  }
  return out;
}

/// The sizes of one ring attention (the RingAttention opcodes): a cp
/// rank's share of `seq` rows, and the cp group.
struct RingAttentionDims {
  int64_t seq = 0, batch = 0, heads = 0, headDim = 0;
  bool causal = true;
  int64_t cpRank = 0, cpSize = 1;
  /// Floats of one packed K/V block [seq, batch, heads, 2, headDim].
  TESSERA_HD int64_t kvBlock() const { return seq * batch * heads * 2 * headDim; }
  /// Floats of one value per (row, batch, head).
  TESSERA_HD int64_t rowStats() const { return seq * batch * heads; }
  /// Workspace floats: the forward's two K/V blocks and running max and
  /// sum ([batch * heads, seq] each); the backward's two K/V blocks, two
  /// dK/dV blocks and sum(dO * O) ([batch * heads, seq]). With the K/V
  /// blocks travelling in 16 bits the two blocks' place holds one f32
  /// block the step reads and the two 16-bit blocks in flight: the same
  /// floats.
  TESSERA_HD int64_t forwardWorkspace() const {
    return 2 * kvBlock() + 2 * rowStats();
  }
  TESSERA_HD int64_t backwardWorkspace() const {
    return 4 * kvBlock() + rowStats();
  }
};

/// A pair of a local query chunk and a key chunk of one ring step that is
/// not wholly masked: their local row offsets, and whether the pair lies on
/// the causal diagonal (query row i then sees key rows [0, i]).
struct RingChunkPair {
  int64_t q0 = 0, k0 = 0;
  bool diagonal = false;
};
struct RingChunkPairs {
  RingChunkPair pair[4];
  int count = 0;
};

/// The chunk pairs of this cp rank's queries against the K/V block of cp
/// rank `source`: every pair of its two query chunks and the block's two
/// key chunks, without the pairs whose keys all follow the queries
/// (causal).
TESSERA_HD RingChunkPairs ringChunkPairs(const RingAttentionDims &d,
                                         int64_t source) {
  RingChunkPairs out;
  const int64_t chunk = d.seq / 2;
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 2; ++c) {
      const int64_t gq = cpChunkIndex(d.cpRank, d.cpSize, a);
      const int64_t gk = cpChunkIndex(source, d.cpSize, c);
      if (d.causal && gk > gq)
        continue;
      out.pair[out.count].q0 = a * chunk;
      out.pair[out.count].k0 = c * chunk;
      out.pair[out.count].diagonal = d.causal && gk == gq;
      ++out.count;
    }
  return out;
}

} // namespace tessera::rt::math

#endif // TESSERA_RT_MATH_SEQUENCELAYOUT_H
