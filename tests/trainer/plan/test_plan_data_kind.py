"""`fullres plan --data` measures the input of CT volumes or video clips; detection's records are refused in one
sentence naming what they are and what to do, not called damaged CT records to convert again."""

from typer.testing import CliRunner


def test_plan_data_of_images_with_boxes_names_them_and_says_to_leave_data_out(tmp_path):
    from pipelines import cli
    from preprocessing.images import demo_images

    shapes = demo_images.write_demo_tfrecords(str(tmp_path / "shapes"), num_train=2, num_eval=0, size=(64, 64))
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "detection_demo", "--image-size", "64,64",
                                          "--data", shapes["train"]])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"fullres: error: --data {shapes['train']} holds images with boxes, but fullres plan --data measures the input "
        "of CT volumes or video clips only (the records of fullres preprocess ct or video); leave --data out to plan "
        "the detection step without measuring its input, or pass CT or clip records.\n")
