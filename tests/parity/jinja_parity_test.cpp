// Triad's Jinja against Jinja2 (CTest label "parity"): jinja_reference.py,
// run by CTest as a fixture before this, renders chat templates in the
// style of the common model families (and one exercising the rest of the
// language) with Jinja2 set up as transformers sets it up, for several
// conversations and settings. Triad must write the same text, case by
// case, and fail where Jinja2 failed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "triad/core/error.h"
#include "triad/data/jinja.h"

namespace triad::data::jinja {
namespace {

TEST(JinjaParity, ChatTemplatesRenderAsJinja2RendersThem) {
  if (const char* why = std::getenv("TRIAD_JINJA_UNAVAILABLE"); why && *why) GTEST_SKIP() << why;
  const char* dir = std::getenv("TRIAD_JINJA_REFERENCE");
  ASSERT_NE(dir, nullptr) << "TRIAD_JINJA_REFERENCE is not set";
  const std::string file = std::string(dir) + "/cases.json";
  std::ifstream in(file);
  ASSERT_TRUE(in) << "missing " << file << " (the reference fixture did not run)";
  const auto cases = nlohmann::ordered_json::parse(in);
  ASSERT_GE(cases.size(), 90u);
  size_t rendered = 0, failed = 0;
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    const Template t(c.at("template").get<std::string>());
    if (c.contains("error")) {
      EXPECT_THROW(t.render(c.at("context")), ValueError) << "Jinja2: " << c.at("error");
      ++failed;
      continue;
    }
    std::string got;
    try {
      got = t.render(c.at("context"));
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    EXPECT_EQ(got, c.at("output").get<std::string>());
    ++rendered;
  }
  EXPECT_GT(rendered, 80u);
  EXPECT_GT(failed, 5u);
}

}  // namespace
}  // namespace triad::data::jinja
