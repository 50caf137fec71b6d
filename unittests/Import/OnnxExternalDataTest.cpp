//===- OnnxExternalDataTest.cpp - External data stays in the model's dir -===//
//
// An ONNX model is input, and its initializers' external-data `location`s
// name files: the reader accepts only a relative location that stays, with
// symbolic links resolved, inside the model's directory, and numbers for
// its offset and length that are integers in [0, 2^63). Each case rewrites
// the committed gpt-ext.onnx fixture (its first external initializer) into
// a temporary model directory and checks the reader's error, which names
// the tensor and the bad value.
//
//===----------------------------------------------------------------------===//

#include "tessera/Import/OnnxModel.h"

#include "onnx/onnx_pb.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;
using tessera::onnx_model::loadModel;
using tessera::onnx_model::Model;

namespace {

const fs::path kFixtures =
    fs::path(TESSERA_SOURCE_DIR) / "test/Import/Inputs/onnx";

class OnnxExternalDataTest : public ::testing::Test {
protected:
  void SetUp() override {
    root = fs::temp_directory_path() /
           ("tessera-onnx-ext-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    modelDir = root / "model";
    fs::create_directories(modelDir);
    fs::copy_file(kFixtures / "gpt-ext.onnx.data",
                  modelDir / "gpt-ext.onnx.data");
    // A file outside the model's directory that a model must not reach.
    std::ofstream(root / "outside.data") << std::string(1 << 16, 'x');
    std::ifstream in(kFixtures / "gpt-ext.onnx", std::ios::binary);
    ASSERT_TRUE(proto.ParseFromIstream(&in));
  }
  void TearDown() override { fs::remove_all(root); }

  /// The fixture with `entries` of its first external initializer set
  /// (replacing those keys), written as model/x.onnx; loadModel's error.
  std::string load(const std::vector<std::pair<std::string, std::string>> &entries) {
    onnx::ModelProto m = proto;
    for (onnx::TensorProto &t : *m.mutable_graph()->mutable_initializer()) {
      if (t.data_location() != onnx::TensorProto::EXTERNAL)
        continue;
      for (const auto &[key, value] : entries) {
        bool found = false;
        for (onnx::StringStringEntryProto &e : *t.mutable_external_data())
          if (e.key() == key) {
            e.set_value(value);
            found = true;
          }
        if (!found) {
          onnx::StringStringEntryProto *e = t.add_external_data();
          e->set_key(key);
          e->set_value(value);
        }
      }
      tensor = t.name();
      break;
    }
    std::ofstream out(modelDir / "x.onnx", std::ios::binary);
    EXPECT_TRUE(m.SerializeToOstream(&out));
    out.close();
    Model model;
    return loadModel((modelDir / "x.onnx").string(), /*loadWeights=*/true,
                     model);
  }

  onnx::ModelProto proto;
  fs::path root, modelDir;
  std::string tensor;
};

#define EXPECT_HAS(text, part)                                                 \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST_F(OnnxExternalDataTest, TheFixtureLoads) {
  EXPECT_EQ(load({}), "");
}

TEST_F(OnnxExternalDataTest, ParentDirectoryIsRefused) {
  std::string error = load({{"location", "../outside.data"}});
  EXPECT_HAS(error, "tensor '" + tensor + "': external data location "
                    "'../outside.data' leaves the model's directory ('..')");
}

TEST_F(OnnxExternalDataTest, AbsoluteLocationIsRefused) {
  // Also with a decoy of the same name inside the model's directory (the
  // onnx checker stats "<modeldir>//<absolute path>").
  fs::create_directories(modelDir / root.relative_path());
  fs::copy_file(root / "outside.data",
                modelDir / root.relative_path() / "outside.data");
  std::string location = (root / "outside.data").string();
  std::string error = load({{"location", location}});
  EXPECT_HAS(error, "location '" + location + "' is absolute");
}

TEST_F(OnnxExternalDataTest, SymbolicLinksOutsideAreRefused) {
  fs::create_symlink(root / "outside.data", modelDir / "link.data");
  std::string error = load({{"location", "link.data"}});
  EXPECT_HAS(error, "resolves (through a symbolic link) to '" +
                        fs::canonical(root / "outside.data").string() +
                        "', outside the model's directory");
  // A symlinked directory too.
  fs::create_directory_symlink(root, modelDir / "up");
  error = load({{"location", "up/outside.data"}});
  EXPECT_HAS(error, "outside the model's directory");
  // A link that stays inside is fine.
  fs::create_symlink(modelDir / "gpt-ext.onnx.data", modelDir / "in.data");
  EXPECT_EQ(load({{"location", "in.data"}}), "");
}

TEST_F(OnnxExternalDataTest, OffsetsAndLengthsAreCheckedNumbers) {
  EXPECT_HAS(load({{"offset", "abc"}}),
             "tensor '" + tensor +
                 "': external data offset 'abc' is not an integer in [0, "
                 "2^63)");
  EXPECT_HAS(load({{"offset", "-4"}}), "offset '-4' is not an integer");
  EXPECT_HAS(load({{"offset", "99999999999999999999"}}),
             "offset '99999999999999999999' is not an integer");
  EXPECT_HAS(load({{"length", "12x"}}), "length '12x' is not an integer");
  EXPECT_HAS(load({{"offset", "1000000000"}}), "less than the offset 1000000000");
}

TEST_F(OnnxExternalDataTest, ConstantsInExternalDataAreReadIn) {
  // A Constant node whose value lies in the external-data file (as torch's
  // TorchScript exporter stores a large model's constants): read in, the
  // bytes its shape needs, and no other length accepted.
  auto write = [&](int64_t lengthDelta) {
    onnx::ModelProto m = proto;
    const onnx::TensorProto *ext = nullptr;
    for (const onnx::TensorProto &t : m.graph().initializer())
      if (t.data_location() == onnx::TensorProto::EXTERNAL && !ext)
        ext = &t;
    onnx::TensorProto value = *ext;
    value.set_name("extra");
    int64_t bytes = 4;
    for (int64_t d : value.dims())
      bytes *= d;
    for (onnx::StringStringEntryProto &e : *value.mutable_external_data())
      if (e.key() == "length")
        e.set_value(std::to_string(bytes + lengthDelta));
    onnx::NodeProto *n = m.mutable_graph()->add_node();
    n->set_op_type("Constant");
    n->set_name("extra_constant");
    n->add_output("extra_output");
    onnx::AttributeProto *a = n->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    *a->mutable_t() = value;
    std::ofstream out(modelDir / "c.onnx", std::ios::binary);
    EXPECT_TRUE(m.SerializeToOstream(&out));
    return bytes;
  };
  int64_t bytes = write(0);
  Model model;
  ASSERT_EQ(loadModel((modelDir / "c.onnx").string(), /*loadWeights=*/true, model), "");
  const tessera::onnx_model::Attribute *value = model.nodes.back().attr("value");
  ASSERT_NE(value, nullptr);
  EXPECT_FALSE(value->tensor->isExternal());
  EXPECT_EQ(int64_t(value->tensor->data.size()), bytes);
  write(4);
  Model bad;
  EXPECT_HAS(loadModel((modelDir / "c.onnx").string(), /*loadWeights=*/true, bad),
             "tensor 'extra': its external data is " + std::to_string(bytes + 4) +
                 " bytes, its shape needs " + std::to_string(bytes));
}

TEST_F(OnnxExternalDataTest, MissingFileIsNamed) {
  EXPECT_HAS(load({{"location", "nothing.data"}}),
             "location 'nothing.data' cannot be opened");
}

} // namespace
