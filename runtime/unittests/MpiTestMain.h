//===- MpiTestMain.h - gtest main for tests run under mpirun ------*- C++ -*-===//
//
// Every rank runs the tests; the process exit code is the worst over ranks,
// so a failure on any rank fails the ctest. Include once, from the test's
// .cpp; it also gives the tests the world rank, size and communicator.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_UNITTESTS_MPITESTMAIN_H
#define TESSERA_RT_UNITTESTS_MPITESTMAIN_H

#include "tessera/rt/MpiCommunicator.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>

namespace tessera::rt::test {
inline int mpiWorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int mpiWorldSize() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
inline int worldRank() { return mpiWorldRank(); }
inline int worldSize() { return mpiWorldSize(); }

/// A communicator over a duplicate of MPI_COMM_WORLD.
inline std::unique_ptr<Communicator> worldComm() {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  auto c = createMpiCommunicator(dup);
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}
} // namespace tessera::rt::test

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ::testing::InitGoogleTest(&argc, argv);
  int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (tessera::rt::test::mpiWorldRank() == 0)
    std::printf("[mpi] %d ranks, worst exit code %d\n",
                tessera::rt::test::mpiWorldSize(), global);
  MPI_Finalize();
  return global;
}

#endif // TESSERA_RT_UNITTESTS_MPITESTMAIN_H
